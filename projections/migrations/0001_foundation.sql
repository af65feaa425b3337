-- Positions, epochs and the episodes projection. Runs with search_path = <schema>, public.
CREATE TABLE projection_positions (
    projection  text   NOT NULL,
    topic       text   NOT NULL,
    partition   int    NOT NULL,
    next_offset bigint NOT NULL,  -- the next offset to apply; everything below is applied
    PRIMARY KEY (projection, topic, partition)
);

-- A rebuild bumps its projection's epoch; Redis keys carry it, so old cache entries go stale.
CREATE TABLE projection_epochs (
    projection text PRIMARY KEY,
    epoch      int  NOT NULL
);
INSERT INTO projection_epochs VALUES ('episodes', 1);

CREATE TABLE episodes (
    episode_id        uuid        PRIMARY KEY,      -- uuid5(source_event_id, 'episode')
    source_event_id   uuid        NOT NULL UNIQUE,
    user_id           text        NOT NULL,
    conversation_id   text        NOT NULL,
    occurred_at       timestamptz NOT NULL,         -- world time, from the host
    recorded_at       timestamptz NOT NULL,         -- system time: the event's log timestamp
    source_partition  int         NOT NULL,
    source_offset     bigint      NOT NULL,
    user_message      text        NOT NULL,
    assistant_message text        NOT NULL,
    metadata          jsonb,
    embedding         vector(384) NOT NULL,
    embedding_model   text        NOT NULL,
    tsv tsvector GENERATED ALWAYS AS
        (to_tsvector('english', user_message || ' ' || assistant_message)) STORED
);
CREATE INDEX episodes_embedding_hnsw ON episodes USING hnsw (embedding vector_cosine_ops);
CREATE INDEX episodes_tsv_gin ON episodes USING gin (tsv);
CREATE INDEX episodes_user_time ON episodes (user_id, occurred_at DESC);
CREATE INDEX episodes_conversation_time ON episodes (user_id, conversation_id, occurred_at DESC);
