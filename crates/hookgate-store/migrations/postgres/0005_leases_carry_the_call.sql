-- A lease now carries the call: an item is marked nothing before its CRM call, since an item
-- in flight counts as in doubt (a write may be out), and the lease itself is the fence.
--  - `leased_at_ms`: when the current lease took the item. A lease that takes an item over
--    from a worker that never recorded an outcome keeps this as the start of the abandoned
--    attempt in the evidence. `lease_expires_at_ms` on the item is the end its lease was
--    taken with; the entity row holds the lease and its renewals.
ALTER TABLE outbox ADD COLUMN leased_at_ms BIGINT;

-- How many items the item's event has, set at intake (NULL for items made before): an item
-- alone in its event finishes with the event's state known, without locking the event or
-- reading its other items.
ALTER TABLE outbox ADD COLUMN siblings BIGINT;

-- Leases are found by entity key (the lease statements carry the keys they claimed), so no
-- index reads `lease_owner`: claiming, renewing and releasing an entity change no indexed
-- column, and PostgreSQL can update the row in place (HOT) when its page has room, which a
-- lower fill factor leaves for it.
DROP INDEX entities_lease_owner;
ALTER TABLE entities SET (fillfactor = 70);

-- An event's state changes once or twice in its life (accepted, then done or dead), and it is
-- read by pipeline and age (retention, listings), never ranged over by state: the index leads
-- with what is read, so the state update changes no indexed column and is made in place when
-- the page has room, which a fill factor below 100 leaves (bodies over 2 KB live out of line).
CREATE INDEX events_pipeline_received ON events (pipeline, received_at_ms);
DROP INDEX events_pipeline_state;
ALTER TABLE events SET (fillfactor = 90);
