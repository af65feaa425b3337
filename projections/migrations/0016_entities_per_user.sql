-- Entities keyed by (user_id, entity_id), like every other row. Entity ids derive from the
-- turn's event id (uuid5(event_id, 'entity:<n>')), which the host chooses: two users' turns
-- with one event id name the same ids, and keyed by id alone the second user's entity
-- overwrote the first's (the upsert's conflict). An edge references its own user's entities.
-- A store written before this with such a collision fails the new foreign keys here: rebuild
-- it by replay (the whole chain on empty tables).
DO $$
DECLARE fk text;
BEGIN
    FOR fk IN SELECT conname FROM pg_constraint
              WHERE conrelid = 'memory_edges'::regclass AND contype = 'f' AND confrelid = 'entities'::regclass LOOP
        EXECUTE format('ALTER TABLE memory_edges DROP CONSTRAINT %I', fk);
    END LOOP;
END $$;
ALTER TABLE entities DROP CONSTRAINT entities_pkey, ADD PRIMARY KEY (user_id, entity_id);
DROP INDEX entities_user;  -- the key's first column serves a user's entities
ALTER TABLE memory_edges
    ADD FOREIGN KEY (user_id, source_entity_id) REFERENCES entities (user_id, entity_id) DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (user_id, target_entity_id) REFERENCES entities (user_id, entity_id) DEFERRABLE INITIALLY DEFERRED;
