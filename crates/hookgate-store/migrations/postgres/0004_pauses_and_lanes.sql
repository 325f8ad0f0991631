-- Operators' pauses, shared by every gateway on this database.
--  - kind 'intake', target '': the pipeline's intake answers 503 with Retry-After;
--  - kind 'delivery', target T: writes of the pipeline's target T are not leased (held, not
--    dropped); writes already leased finish.
CREATE TABLE pauses (
    pipeline TEXT NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    paused_at_ms BIGINT NOT NULL,
    reason TEXT,
    PRIMARY KEY (pipeline, kind, target)
);

-- Lanes: 0 for fresh work, 1 for operators' replays. Leases take from both lanes in turn, so
-- a large replay cannot starve fresh deliveries (nor they it). The due index leads with the
-- lane so that each lane is its own index range.
ALTER TABLE outbox ADD COLUMN lane BIGINT NOT NULL DEFAULT 0;
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (state, lane, next_attempt_at_ms);

-- Parked writes: a delivery pause moves its target's pending writes to lane + 2, out of the
-- due index's ranges, so that leases do not walk a paused backlog; resuming moves them back.
-- This index holds parked rows only.
CREATE INDEX outbox_parked ON outbox (pipeline, target) WHERE lane >= 2;
