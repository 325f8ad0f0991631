-- The inbox: one row per event, unique per (pipeline, scope, key). The unique constraint is
-- what makes deduplication hold across connections, processes and restarts.
CREATE TABLE events (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline TEXT NOT NULL,
    scope TEXT NOT NULL,
    event_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    event_type TEXT,
    received_at_ms BIGINT NOT NULL,
    headers TEXT NOT NULL,
    body BYTEA NOT NULL,
    state TEXT NOT NULL,
    delivery_count BIGINT NOT NULL,
    conflict_count BIGINT NOT NULL DEFAULT 0,
    last_delivery_at_ms BIGINT NOT NULL,
    UNIQUE (pipeline, scope, event_key)
);
CREATE INDEX events_pipeline_state ON events (pipeline, state, received_at_ms);

-- The outbox: one row per CRM write an event asks for, created in the same transaction.
-- `entity` is the ordering entity, or the target's external id: writes to one entity are
-- leased one at a time, in version order (receipt order without a version).
-- States: pending -> in_flight -> done | pending (retry) | dead | skipped_stale.
-- `in_doubt` is set while a write may have reached the CRM without its answer reaching us;
-- whoever leases the item next looks the record up before writing again.
CREATE TABLE outbox (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id BIGINT NOT NULL REFERENCES events (id),
    pipeline TEXT NOT NULL,
    target TEXT NOT NULL,
    target_index BIGINT NOT NULL,
    entity TEXT NOT NULL,
    version TEXT,
    state TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    next_attempt_at_ms BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    lease_owner TEXT,
    lease_expires_at_ms BIGINT,
    in_doubt BIGINT NOT NULL DEFAULT 0,
    record_id TEXT,
    last_error TEXT,
    finished_at_ms BIGINT,
    UNIQUE (event_id, target)
);
CREATE INDEX outbox_due ON outbox (state, next_attempt_at_ms);
CREATE INDEX outbox_entity ON outbox (pipeline, target, entity, state);

-- Every attempt at a CRM write, with the CRM's answer: the evidence of delivery.
CREATE TABLE attempts (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id BIGINT NOT NULL REFERENCES outbox (id),
    event_id BIGINT NOT NULL REFERENCES events (id),
    attempt BIGINT NOT NULL,
    worker TEXT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    finished_at_ms BIGINT,
    action TEXT,
    outcome TEXT,
    status BIGINT,
    excerpt TEXT,
    error TEXT,
    record_id TEXT,
    meta TEXT
);
CREATE INDEX attempts_event ON attempts (event_id);

-- The last version applied per (pipeline, target, entity): the version guard.
CREATE TABLE entity_versions (
    pipeline TEXT NOT NULL,
    target TEXT NOT NULL,
    entity TEXT NOT NULL,
    version TEXT NOT NULL,
    PRIMARY KEY (pipeline, target, entity)
);

-- Every verified delivery, whatever became of it: the evidence behind "what happened to X".
-- Bodies are kept for conflicts and rejections; an accepted event's body is on the event.
CREATE TABLE deliveries (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline TEXT NOT NULL,
    event_id BIGINT REFERENCES events (id),
    outcome TEXT NOT NULL,
    received_at_ms BIGINT NOT NULL,
    scope TEXT,
    event_key TEXT,
    fingerprint TEXT,
    reason TEXT,
    headers TEXT NOT NULL,
    body BYTEA
);
CREATE INDEX deliveries_event ON deliveries (event_id);
CREATE INDEX deliveries_pipeline_outcome ON deliveries (pipeline, outcome, received_at_ms);
