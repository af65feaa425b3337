-- The HNSW indexes rebuilt with ef_construction = 200 (pgvector's default is 64). Many users'
-- memories repeat each other's ("Likes coffee"): the vectors form tight clusters, and a graph
-- built with 64 candidates per insert linked some clusters so poorly that a search never reached
-- them, whatever its ef_search (400 did not help) and with or without the user filter: on the
-- 1M-row benchmark corpus the heavy user's nearest "Friend is Ana" facts (cosine distance 0.42)
-- came back as "Dislikes baking" (0.74). Rebuilt with 200, such far-off searches on one partition
-- fell from 3.5 to 1.6 of 22 questions on average over builds (400: 0.5, but each insert costs
-- 2.5 instead of 1.2 ms; 200 costs 1.5); the search itself costs the same (BENCHMARKS.md).
SET LOCAL maintenance_work_mem = '512MB';
DROP INDEX episodes_embedding_hnsw;
CREATE INDEX episodes_embedding_hnsw ON episodes USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200);
DROP INDEX memory_facts_embedding_hnsw;
CREATE INDEX memory_facts_embedding_hnsw ON memory_facts USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200);
DROP INDEX memory_edges_embedding_hnsw;
CREATE INDEX memory_edges_embedding_hnsw ON memory_edges USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 200);
