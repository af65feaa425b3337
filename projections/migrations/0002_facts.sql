-- Facts: every version of every fact, current or not. A version stops being believed when it is
-- superseded or deleted; its row stays, with when (system time), until when it was true (world
-- time) and why.
CREATE TABLE memory_facts (
    fact_id           uuid        PRIMARY KEY,       -- uuid5(source_event_id, 'fact:<n>')
    lineage_id        uuid        NOT NULL,          -- the first version's fact_id
    version           int         NOT NULL,          -- 1, 2, ... within the lineage
    user_id           text        NOT NULL,
    text              text        NOT NULL,
    category          text        NOT NULL,
    attribute         text        NOT NULL,
    value             text        NOT NULL,
    confidence        real        NOT NULL,
    explicit          boolean     NOT NULL,
    status            text        NOT NULL CHECK (status IN ('current', 'superseded', 'deleted')),
    valid_from        timestamptz NOT NULL,          -- world time
    valid_to          timestamptz,
    recorded_at       timestamptz NOT NULL,          -- system time (log), believed from
    superseded_at     timestamptz,                   -- system time, believed until
    superseded_by     uuid,
    end_reason        text,
    observation_count int         NOT NULL,
    last_observed_at  timestamptz NOT NULL,
    observed_by       uuid[]      NOT NULL,          -- decision ids counted (idempotent reinforcement)
    deferred          jsonb       NOT NULL,          -- gate: value -> inferred observations refused so far
    source_event_id   uuid        NOT NULL,
    extractor         text        NOT NULL,
    resolver          text        NOT NULL,
    reason            text        NOT NULL,
    embedding         vector(384) NOT NULL,
    embedding_model   text        NOT NULL,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE INDEX memory_facts_embedding_hnsw ON memory_facts USING hnsw (embedding vector_cosine_ops);
CREATE INDEX memory_facts_tsv_gin ON memory_facts USING gin (tsv);
CREATE INDEX memory_facts_current ON memory_facts (user_id, attribute) WHERE status = 'current';
CREATE INDEX memory_facts_lineage ON memory_facts (lineage_id, version);
INSERT INTO projection_epochs VALUES ('facts', 1);
