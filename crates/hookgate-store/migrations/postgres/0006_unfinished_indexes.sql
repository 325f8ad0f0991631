-- The outbox's state indexes hold only the rows they are read for. Finished writes are most of
-- the table and are never ranged over by state: a write's finish (in flight -> done) adds no
-- entry to an index whose predicate the done row fails, so it costs two index insertions
-- (the key and `(event_id, target)`) instead of four, and the due and entity indexes stay the
-- size of the backlog rather than of the history.
--  - `outbox_due`: the leases' walks (pending by lane and due time; in flight) and the backlog
--    gauges. Each query names `state` so that the planner can prove the predicate.
--  - `outbox_entity`: the head rule (an entity's other unfinished writes) and the items a
--    lease takes by entity key.
--  - `outbox_dead`: dead letters, newest first, and the events a replay takes.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (state, lane, next_attempt_at_ms)
    WHERE state IN ('pending', 'in_flight');
DROP INDEX outbox_entity;
CREATE INDEX outbox_entity ON outbox (pipeline, target, entity)
    WHERE state IN ('pending', 'in_flight');
CREATE INDEX outbox_dead ON outbox (id) WHERE state = 'dead';
