-- `in_flight` has not been a state of items since 0007: an entity's row names the item a lease
-- has out, and the item stays `pending`. The partial indexes of unfinished writes say so; their
-- rows are the same.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (state, lane, next_attempt_at_ms) WHERE state = 'pending';
DROP INDEX outbox_entity;
CREATE INDEX outbox_entity ON outbox (pipeline, target, entity) WHERE state = 'pending';
