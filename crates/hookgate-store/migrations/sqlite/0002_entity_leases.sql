-- Entities: one row per (pipeline, target, entity) that has been worked on. It carries
--  - the entity lease: one worker at a time per entity, across processes. The lease is the
--    fence every write of an item checks (`lease_owner`), and it is renewed before each CRM
--    call, so no call outlives it;
--  - the version guard: the last version confirmed applied (`applied_version`, a sort key,
--    with the sender's form in `applied_version_text`), and the highest version of a write
--    dead-lettered while in doubt (`doubted_version`): it may be in the CRM, so older versions
--    are not written. Both only move forward; neither a replay nor retention lowers them.
-- Rows are created lazily by the first lease of an entity.
CREATE TABLE entities (
    pipeline TEXT NOT NULL,
    target TEXT NOT NULL,
    entity TEXT NOT NULL,
    applied_version TEXT,
    applied_version_text TEXT,
    doubted_version TEXT,
    doubted_version_text TEXT,
    lease_owner TEXT,
    lease_expires_at_ms BIGINT,
    PRIMARY KEY (pipeline, target, entity)
);
CREATE INDEX entities_lease_owner ON entities (lease_owner) WHERE lease_owner IS NOT NULL;

-- The guard moves over; items leased under the old scheme are taken over when their entity
-- is next claimed (an attempt that began is still marked in doubt on its item).
INSERT INTO entities (pipeline, target, entity, applied_version, applied_version_text)
    SELECT pipeline, target, entity, version, version FROM entity_versions;
DROP TABLE entity_versions;
INSERT INTO entities (pipeline, target, entity, doubted_version, doubted_version_text)
    SELECT * FROM (SELECT pipeline, target, entity, MAX(version), MAX(version) FROM outbox
        WHERE state = 'dead' AND in_doubt = 1 AND version IS NOT NULL
        GROUP BY pipeline, target, entity) AS doubted WHERE true
    ON CONFLICT (pipeline, target, entity) DO UPDATE
        SET doubted_version = excluded.doubted_version, doubted_version_text = excluded.doubted_version_text;

-- The version as the sender wrote it (`9`, not its sort key), for evidence.
ALTER TABLE outbox ADD COLUMN version_text TEXT;
