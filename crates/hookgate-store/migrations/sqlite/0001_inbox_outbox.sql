-- The inbox: one row per event, unique per (pipeline, scope, key). The unique constraint is
-- what makes deduplication hold across connections, processes and restarts.
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    scope TEXT NOT NULL,
    event_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    event_type TEXT,
    received_at_ms INTEGER NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    state TEXT NOT NULL,
    delivery_count INTEGER NOT NULL,
    conflict_count INTEGER NOT NULL DEFAULT 0,
    last_delivery_at_ms INTEGER NOT NULL,
    UNIQUE (pipeline, scope, event_key)
);

-- The outbox: one row per CRM write an event asks for, created in the same transaction.
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id INTEGER NOT NULL REFERENCES events (id),
    target TEXT NOT NULL,
    target_index INTEGER NOT NULL,
    entity TEXT,
    version TEXT,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at_ms INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    UNIQUE (event_id, target)
);
CREATE INDEX outbox_due ON outbox (state, next_attempt_at_ms);

-- Every verified delivery, whatever became of it: the evidence behind "what happened to X".
-- Bodies are kept for conflicts and rejections; an accepted event's body is on the event.
CREATE TABLE deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    event_id INTEGER REFERENCES events (id),
    outcome TEXT NOT NULL,
    received_at_ms INTEGER NOT NULL,
    scope TEXT,
    event_key TEXT,
    fingerprint TEXT,
    reason TEXT,
    headers TEXT NOT NULL,
    body BLOB
);
CREATE INDEX deliveries_event ON deliveries (event_id);
CREATE INDEX deliveries_pipeline_outcome ON deliveries (pipeline, outcome, received_at_ms);
