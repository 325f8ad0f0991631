-- Protected payloads.
--  - `sealed_with`: the id of the key a row's body and headers are encrypted under (AEAD, by
--    the engine; the store sees bytes), or NULL for plaintext. One column per row, so keys
--    rotate row by row: new rows under the new key, old rows readable until re-sealed.
--    An attempt's `excerpt` (the CRM's or the source's answer, which can echo the payload) is
--    sealed the same way, with its own `sealed_with`.
--  - `payload_purged_at_ms`: when `payload_retention` deleted the event's body and headers
--    (set to empty). The key, fingerprint and evidence stay until `retention`, so a
--    redelivery is still a duplicate; a replay is refused.
ALTER TABLE events ADD COLUMN sealed_with TEXT;
ALTER TABLE events ADD COLUMN payload_purged_at_ms BIGINT;
ALTER TABLE deliveries ADD COLUMN sealed_with TEXT;
ALTER TABLE attempts ADD COLUMN sealed_with TEXT;
ALTER TABLE deliveries ADD COLUMN payload_purged_at_ms BIGINT;
CREATE INDEX events_payload_kept ON events (pipeline, received_at_ms) WHERE payload_purged_at_ms IS NULL;
