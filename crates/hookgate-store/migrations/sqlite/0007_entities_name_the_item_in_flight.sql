-- An entity's lease names the item it took, so that a lease writes no outbox row: an outbox
-- row changes once per attempt, at its finish, instead of twice (a lease that moved it to
-- `in_flight` changed an indexed column, so it was never an in-place update and inserted into
-- every outbox index).
--  - `in_flight_item`: the item the lease took; set while a write of it may be out, from the
--    lease until its finish. An item in flight stays `pending` in `outbox`.
--  - `in_flight_owner`, `in_flight_since_ms`: the lease that took it and when, kept after the
--    lease ends (a renewal or a claim changes `lease_owner`, never these), so that a lease that
--    takes the entity over records the abandoned attempt as evidence.
-- None is indexed: leasing and finishing still update entity rows in place.
ALTER TABLE entities ADD COLUMN in_flight_item BIGINT;
ALTER TABLE entities ADD COLUMN in_flight_owner TEXT;
ALTER TABLE entities ADD COLUMN in_flight_since_ms BIGINT;

-- Items left in flight by the code before: their attempt is recorded as abandoned, and they
-- are pending again in doubt (a write may be out), to be looked up before anything else of
-- their entity is written, as a takeover would.
INSERT INTO attempts (outbox_id, event_id, attempt, worker, started_at_ms, finished_at_ms, action, outcome, error)
    SELECT id, event_id, attempts, COALESCE(lease_owner, ''), COALESCE(leased_at_ms, next_attempt_at_ms),
        COALESCE(leased_at_ms, next_attempt_at_ms), 'lease', 'abandoned',
        'the gateway was upgraded while this write was in flight: a write may have been sent, so the record is looked up before anything is written'
    FROM outbox WHERE state = 'in_flight';
UPDATE outbox SET state = 'pending', in_doubt = 1
    WHERE state = 'in_flight';

-- Nothing writes an item's own lease any more: the entity's row holds the lease and names the
-- item.
ALTER TABLE outbox DROP COLUMN lease_owner;
ALTER TABLE outbox DROP COLUMN lease_expires_at_ms;
ALTER TABLE outbox DROP COLUMN leased_at_ms;
