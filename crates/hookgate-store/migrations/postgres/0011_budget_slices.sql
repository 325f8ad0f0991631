-- A connector instance's call budget, shared by every process on this database: each holds a
-- slice of it, leased and renewed (see the store's `budget` module). The slices of live
-- processes, and calls still in the CRM's window from slices given back or expired, never sum
-- to more than the budget.
--  - `budget_slices`: one row per process and connector; `expires_at_ms` (this database's
--    clock) ends the lease unless renewed. An expired slice still counts for one window after
--    its end: its holder's last calls may be in the CRM's window until then.
--  - `budget_returns`: calls a process gave up (its slice shrank), counted until `free_at_ms`,
--    when its own log says they have left the window.
CREATE TABLE budget_slices (
    connector TEXT NOT NULL,
    owner TEXT NOT NULL,
    calls BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (connector, owner)
);
CREATE TABLE budget_returns (
    connector TEXT NOT NULL,
    calls BIGINT NOT NULL,
    free_at_ms BIGINT NOT NULL
);
CREATE INDEX budget_returns_connector ON budget_returns (connector, free_at_ms);
