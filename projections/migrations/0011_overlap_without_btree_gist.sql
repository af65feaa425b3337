-- One truth at a time for single-valued relations: no two [valid_from, valid_to) intervals of
-- one (user, source, relation) may overlap, checked at commit (a close and the open replacing
-- it may be written in either order within one transaction).
--
-- Built from ranges only, which GiST indexes without btree_gist (Postgres builds without that
-- contrib module, such as the local stack's, cannot run the old form): the slot is a one-point
-- range over an exact text key, so two rows' slots overlap exactly when their keys are equal.
-- The key is injective: a uuid's text is 36 characters and the relation carries its length.
-- A partitioned table only takes exclusion constraints that compare every partitioning column
-- with `=`, which this one no longer does, so it is created on each partition: enough, since a
-- user's edges all live in one partition. A partition added later needs it too.
--
-- Fresh installs reach this with no overlap constraint (0003 and 0007 no longer make one);
-- installs migrated before 2026-12-01 have 0007's btree_gist form, dropped here (dropping
-- needs no btree_gist code, so it runs on either kind of server).
ALTER TABLE memory_edges DROP CONSTRAINT IF EXISTS memory_edges_single_valued_no_overlap;

CREATE TYPE edge_slot_range AS RANGE (subtype = text, collation = "C");

CREATE FUNCTION edge_slot(user_id text, source_entity_id uuid, relation text) RETURNS edge_slot_range
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN edge_slot_range(source_entity_id::text || length(relation)::text || ':' || relation || user_id,
                           source_entity_id::text || length(relation)::text || ':' || relation || user_id, '[]');

DO $$
DECLARE
    part name;
BEGIN
    FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'memory_edges'::regclass ORDER BY 1 LOOP
        EXECUTE format(
            'ALTER TABLE %I ADD CONSTRAINT %I EXCLUDE USING gist ('
            '  edge_slot(user_id, source_entity_id, relation) WITH &&,'
            '  tstzrange(valid_from, valid_to, ''[)'') WITH &&'
            ') WHERE (NOT multi_valued) DEFERRABLE INITIALLY DEFERRED',
            part, part || '_no_overlap');
    END LOOP;
END $$;
