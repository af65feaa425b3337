-- The graph's edges, hash-partitioned by user_id like episodes and facts (0006): with edges
-- spread over many users, a per-user nearest-edge search on one table-wide HNSW graph walked
-- thousands of other users' edges (40-100 ms for a 2k-edge user among 70k edges, measured).
-- The overlap constraint includes user_id with equality, as a partitioned table requires.
ALTER TABLE memory_edges RENAME TO memory_edges_unpartitioned;
ALTER TABLE memory_edges_unpartitioned RENAME CONSTRAINT memory_edges_single_valued_no_overlap TO memory_edges_unpartitioned_no_overlap;
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
    ADD FOREIGN KEY (target_entity_id) REFERENCES entities DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT memory_edges_single_valued_no_overlap EXCLUDE USING gist (
        user_id WITH =, source_entity_id WITH =, relation WITH =,
        tstzrange(valid_from, valid_to, '[)') WITH &&
    ) WHERE (NOT multi_valued) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX memory_edges_embedding_hnsw ON memory_edges USING hnsw (embedding vector_cosine_ops);
CREATE INDEX memory_edges_current ON memory_edges (user_id, source_entity_id, relation) WHERE valid_to IS NULL;
CREATE INDEX memory_edges_current_target ON memory_edges (target_entity_id) WHERE valid_to IS NULL;
CREATE INDEX memory_edges_timeline ON memory_edges (user_id, source_entity_id, relation, valid_from);
-- The projection loads the edges a batch targets by id alone.
CREATE INDEX memory_edges_edge_id ON memory_edges (edge_id);
