-- A lease now carries the call: an item is marked nothing before its CRM call, since an item
-- in flight counts as in doubt (a write may be out), and the lease itself is the fence.
--  - `leased_at_ms`: when the current lease took the item. A lease that takes an item over
--    from a worker that never recorded an outcome keeps this as the start of the abandoned
--    attempt in the evidence. `lease_expires_at_ms` on the item is the end its lease was
--    taken with; the entity row holds the lease and its renewals.
ALTER TABLE outbox ADD COLUMN leased_at_ms BIGINT;

-- Leases are found by entity key (the lease statements carry the keys they claimed), so no
-- index reads `lease_owner`.
DROP INDEX entities_lease_owner;
