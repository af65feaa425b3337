-- The graph's edges, hash-partitioned by user_id like episodes and facts (0006): with edges
-- spread over many users, a per-user nearest-edge search on one table-wide HNSW graph walked
-- thousands of other users' edges (40-100 ms for a 2k-edge user among 70k edges, measured).
-- The overlap constraint is 0011's, on each partition. (Until 2026-12-01 this migration moved
-- 0003's btree_gist constraint to the partitioned table; 0011 replaces it where it exists.)
ALTER TABLE memory_edges RENAME TO memory_edges_unpartitioned;
ALTER INDEX memory_edges_embedding_hnsw RENAME TO memory_edges_unpartitioned_hnsw;

CREATE TABLE memory_edges (LIKE memory_edges_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                           PRIMARY KEY (user_id, edge_id)) PARTITION BY HASH (user_id);
DO $$
BEGIN
    FOR i IN 0..31 LOOP
        EXECUTE format('CREATE TABLE memory_edges_p%s PARTITION OF memory_edges FOR VALUES WITH (MODULUS 32, REMAINDER %s)', i, i);
    END LOOP;
END $$;
INSERT INTO memory_edges SELECT * FROM memory_edges_unpartitioned;
DROP TABLE memory_edges_unpartitioned;

ALTER TABLE memory_edges
    ADD FOREIGN KEY (source_entity_id) REFERENCES entities DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (target_entity_id) REFERENCES entities DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX memory_edges_embedding_hnsw ON memory_edges USING hnsw (embedding vector_cosine_ops);
CREATE INDEX memory_edges_current ON memory_edges (user_id, source_entity_id, relation) WHERE valid_to IS NULL;
CREATE INDEX memory_edges_current_target ON memory_edges (target_entity_id) WHERE valid_to IS NULL;
CREATE INDEX memory_edges_timeline ON memory_edges (user_id, source_entity_id, relation, valid_from);
-- The projection loads the edges a batch targets by id alone.
CREATE INDEX memory_edges_edge_id ON memory_edges (edge_id);
