-- A long turn's passages: every window of its text after the first (the first is the episode's
-- own vector), with the characters it spans and its vector (EpisodeRecorded.passages). The
-- episodes vector search also searches these, and an episode scores by its best passage; a read
-- that cannot fit a long episode returns its best passage instead. Only episodes longer than one
-- window have rows here.
-- Partitioned like episodes, so a user's search is pruned to one partition.
CREATE TABLE episode_passages (
    user_id          text        NOT NULL,
    episode_id       uuid        NOT NULL,
    passage          int         NOT NULL,
    start_char       int         NOT NULL,
    end_char         int         NOT NULL,
    embedding        vector(384) NOT NULL,
    embedding_model  text        NOT NULL,
    PRIMARY KEY (user_id, episode_id, passage)
) PARTITION BY HASH (user_id);
DO $$
BEGIN
    FOR i IN 0..31 LOOP
        EXECUTE format('CREATE TABLE episode_passages_p%s PARTITION OF episode_passages '
                       'FOR VALUES WITH (MODULUS 32, REMAINDER %s)', i, i);
    END LOOP;
END $$;
CREATE INDEX episode_passages_embedding_hnsw ON episode_passages USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200);
