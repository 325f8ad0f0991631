-- Attempts are evidence rows, written only by the store's own statements: a finish inserts
-- them for the items it has just moved (it checks that each was there), a lease settling an
-- abandoned attempt and an operator's replay for the items they read in the same statement;
-- retention deletes them with their event, before it, by ids chosen once. Their two foreign keys were checked per attempt by a query that
-- locked the item's and the event's rows (`FOR KEY SHARE`: a WAL record each, rows the same
-- transaction had just updated): about half of the attempt insert's time, the largest
-- statement of a drain. `Store::orphaned_attempts` counts attempts that name a missing item or
-- event; the store's tests and `cargo xtask chaos` require none. SQLite keeps its foreign keys
-- (its drain is bound by its one writer, and changing them means rebuilding the table).
ALTER TABLE attempts
    DROP CONSTRAINT IF EXISTS attempts_outbox_id_fkey,
    DROP CONSTRAINT IF EXISTS attempts_event_id_fkey;
