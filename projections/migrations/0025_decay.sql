-- Decay: a sweep archives weak facts (``FactArchived``) and a mention restores them
-- (``FactRestored``). An archived fact is still believed (no end in either time axis) but off the
-- read path: a status, so history, as-of reads, forgets and exports keep finding it, while the
-- hot structures hold current facts only — the keyword postings already follow the status
-- (0008), and the vector index is now partial, so superseded, deleted, forgotten and archived
-- versions no longer weigh on its graph walk. Every query that ranks by vector says
-- ``status = 'current'`` (as-of reads scan a user's versions whole and never used it).
ALTER TABLE memory_facts DROP CONSTRAINT memory_facts_status_check,
    ADD CONSTRAINT memory_facts_status_check
        CHECK (status IN ('current', 'superseded', 'deleted', 'forgotten', 'archived'));
-- Built as 0010 builds it (ef_construction = 200: pgvector's 64 loses clusters of near-identical facts).
SET LOCAL maintenance_work_mem = '512MB';
DROP INDEX memory_facts_embedding_hnsw;
CREATE INDEX memory_facts_embedding_hnsw ON memory_facts USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200) WHERE status = 'current';

-- Recall feedback (``MemoriesUsed``): how often the host used each fact in an answer, and when
-- last, as of the log. Read by the decay sweep; deleted with the user.
CREATE TABLE fact_uses (
    user_id      text        NOT NULL,
    fact_id      uuid        NOT NULL,
    uses         integer     NOT NULL,
    last_used_at timestamptz NOT NULL,
    source_offset bigint     NOT NULL,  -- the last MemoriesUsed counted: one delivered again is not
    PRIMARY KEY (user_id, fact_id)
);

-- The last decay sweep of each partition of the events topic (``memstream status``).
CREATE TABLE decay_sweeps (
    topic      text        NOT NULL,
    partition  integer     NOT NULL,
    sweep_id   uuid        NOT NULL,
    swept_at   timestamptz NOT NULL,
    users      integer     NOT NULL,
    archived   integer     NOT NULL,
    PRIMARY KEY (topic, partition)
);
