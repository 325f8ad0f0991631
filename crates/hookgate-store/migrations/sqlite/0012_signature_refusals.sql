-- Deliveries refused for their signature (answered 401) store nothing of themselves: not
-- their body, not their headers. What operators need to see why is kept here instead,
-- aggregated: one row per pipeline, rejection code and reason, counted, with when it was first
-- and last seen and, for URL-signing senders, the URL verified against. Rows are written in
-- batches from memory, so a forged flood costs an increment per request, and a row per reason.
CREATE TABLE signature_refusals (
    pipeline TEXT NOT NULL,
    code TEXT NOT NULL,
    reason TEXT NOT NULL,
    url TEXT,
    first_at_ms BIGINT NOT NULL,
    last_at_ms BIGINT NOT NULL,
    refusals BIGINT NOT NULL,
    PRIMARY KEY (pipeline, code, reason)
);
CREATE INDEX signature_refusals_last ON signature_refusals (last_at_ms);
