-- The bi-temporal graph. World time: valid_from / valid_to (when it was true). System time:
-- recorded_at (believed from, the source event's log timestamp) and closed_at (when valid_to
-- was recorded). Contradictions never delete: they close the current edge and open a new one.
CREATE TABLE entities (
    entity_id       uuid        PRIMARY KEY,
    user_id         text        NOT NULL,
    name            text        NOT NULL,
    aliases         text[]      NOT NULL,
    is_user         boolean     NOT NULL,
    recorded_at     timestamptz NOT NULL,
    source_event_id uuid        NOT NULL
);
CREATE INDEX entities_user ON entities (user_id);
CREATE UNIQUE INDEX entities_one_user_entity ON entities (user_id) WHERE is_user;

CREATE TABLE memory_edges (
    edge_id          uuid        PRIMARY KEY,       -- uuid5(source_event_id, 'edge:<n>')
    user_id          text        NOT NULL,
    source_entity_id uuid        NOT NULL REFERENCES entities DEFERRABLE INITIALLY DEFERRED,
    relation         text        NOT NULL,          -- canonical
    target_entity_id uuid        REFERENCES entities DEFERRABLE INITIALLY DEFERRED,
    target_value     text,
    multi_valued     boolean     NOT NULL,
    valid_from       timestamptz NOT NULL,
    valid_to         timestamptz,
    recorded_at      timestamptz NOT NULL,
    closed_at        timestamptz,
    fact_sentence    text        NOT NULL,
    confidence       real        NOT NULL,
    explicit         boolean     NOT NULL,
    source_event_id  uuid        NOT NULL,
    extractor        text        NOT NULL,
    reason           text        NOT NULL,
    close_reason     text,
    embedding        vector(384) NOT NULL,
    embedding_model  text        NOT NULL,
    CHECK (valid_to IS NULL OR valid_to >= valid_from),
    CHECK ((target_entity_id IS NULL) <> (target_value IS NULL))
    -- One truth at a time for single-valued relations: the overlap constraint is 0011's, per
    -- partition. (Until 2026-12-01 this migration created a btree_gist form here, which a
    -- Postgres without btree_gist cannot run; 0011 replaces it where it exists.)
);
CREATE INDEX memory_edges_embedding_hnsw ON memory_edges USING hnsw (embedding vector_cosine_ops);
CREATE INDEX memory_edges_current ON memory_edges (user_id, source_entity_id, relation) WHERE valid_to IS NULL;
CREATE INDEX memory_edges_current_target ON memory_edges (target_entity_id) WHERE valid_to IS NULL;
CREATE INDEX memory_edges_timeline ON memory_edges (user_id, source_entity_id, relation, valid_from);
INSERT INTO projection_epochs VALUES ('graph', 1);
