-- Cold episodes: a decay sweep moves old, unused episodes out of the hot vector index
-- (``EpisodesSwept``). They are never archived (the audit trail): they stay in every listing, in
-- history and in keyword search, and their vectors go to a second, cold index that a read
-- searches only when the hot one comes back short. ``cooled_at``: the sweep's time, NULL while
-- hot; passages follow their episode.
ALTER TABLE episodes ADD COLUMN cooled_at timestamptz;
ALTER TABLE episode_passages ADD COLUMN cooled_at timestamptz;
-- Built as 0020 builds them (ef_construction = 200), now one graph per tier: the hot graph's walk
-- no longer passes the cold rows.
SET LOCAL maintenance_work_mem = '512MB';
DROP INDEX episodes_embedding_hnsw;
CREATE INDEX episodes_embedding_hnsw ON episodes USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200) WHERE cooled_at IS NULL;
CREATE INDEX episodes_embedding_cold_hnsw ON episodes USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200) WHERE cooled_at IS NOT NULL;
DROP INDEX episode_passages_embedding_hnsw;
CREATE INDEX episode_passages_embedding_hnsw ON episode_passages USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200) WHERE cooled_at IS NULL;
CREATE INDEX episode_passages_embedding_cold_hnsw ON episode_passages USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200) WHERE cooled_at IS NOT NULL;

-- Recall feedback for episodes (``MemoriesUsed.episode_ids``), as ``fact_uses`` is for facts:
-- read by the decay sweep (an episode in use is not cooled, and a cold one used comes back);
-- deleted with the user (ids and counts only: a forgotten episode's are never read again).
CREATE TABLE episode_uses (
    user_id       text        NOT NULL,
    episode_id    uuid        NOT NULL,
    uses          integer     NOT NULL,
    last_used_at  timestamptz NOT NULL,
    source_offset bigint      NOT NULL,
    PRIMARY KEY (user_id, episode_id)
);

ALTER TABLE decay_sweeps ADD COLUMN cooled integer NOT NULL DEFAULT 0;
