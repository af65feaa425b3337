-- Filtered ANN per user stays small as the corpus grows: episodes and facts are hash-partitioned
-- by user_id, so a read (always "WHERE user_id = $1") is pruned to one partition and its HNSW
-- graph holds ~1/32 of the rows. A user's share of the graph a scan walks is then 32x larger:
-- iterative scans find their k rows after visiting far fewer tuples, with better recall, while
-- small users keep the btree + exact sort path. Keys include user_id (a partitioned table's
-- unique keys must); ids stay unique on their own because they derive from event ids.
-- The partition count is fixed here; changing it means rebuilding by replay into a new schema.
ALTER TABLE episodes RENAME TO episodes_unpartitioned;
ALTER TABLE memory_facts RENAME TO memory_facts_unpartitioned;
ALTER INDEX episodes_embedding_hnsw RENAME TO episodes_unpartitioned_hnsw;
ALTER INDEX memory_facts_embedding_hnsw RENAME TO memory_facts_unpartitioned_hnsw;

CREATE TABLE episodes (LIKE episodes_unpartitioned INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS,
                       PRIMARY KEY (user_id, episode_id)) PARTITION BY HASH (user_id);
CREATE TABLE memory_facts (LIKE memory_facts_unpartitioned INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS,
                           PRIMARY KEY (user_id, fact_id)) PARTITION BY HASH (user_id);
DO $$
BEGIN
    FOR i IN 0..31 LOOP
        EXECUTE format('CREATE TABLE episodes_p%s PARTITION OF episodes FOR VALUES WITH (MODULUS 32, REMAINDER %s)', i, i);
        EXECUTE format('CREATE TABLE memory_facts_p%s PARTITION OF memory_facts FOR VALUES WITH (MODULUS 32, REMAINDER %s)', i, i);
    END LOOP;
END $$;

INSERT INTO episodes (episode_id, source_event_id, user_id, conversation_id, occurred_at, recorded_at, source_partition,
                      source_offset, user_message, assistant_message, metadata, embedding, embedding_model)
SELECT episode_id, source_event_id, user_id, conversation_id, occurred_at, recorded_at, source_partition,
       source_offset, user_message, assistant_message, metadata, embedding, embedding_model FROM episodes_unpartitioned;
INSERT INTO memory_facts (fact_id, lineage_id, version, user_id, text, category, attribute, value, confidence, explicit,
                          status, valid_from, valid_to, recorded_at, superseded_at, superseded_by, end_reason,
                          observation_count, last_observed_at, observed_by, deferred, source_event_id, extractor,
                          resolver, reason, embedding, embedding_model)
SELECT fact_id, lineage_id, version, user_id, text, category, attribute, value, confidence, explicit,
       status, valid_from, valid_to, recorded_at, superseded_at, superseded_by, end_reason,
       observation_count, last_observed_at, observed_by, deferred, source_event_id, extractor,
       resolver, reason, embedding, embedding_model FROM memory_facts_unpartitioned;
DROP TABLE episodes_unpartitioned;
DROP TABLE memory_facts_unpartitioned;

CREATE INDEX episodes_embedding_hnsw ON episodes USING hnsw (embedding vector_cosine_ops);
CREATE INDEX episodes_tsv_gin ON episodes USING gin (tsv);
CREATE INDEX episodes_user_time ON episodes (user_id, occurred_at DESC);
CREATE INDEX episodes_conversation_time ON episodes (user_id, conversation_id, occurred_at DESC);

CREATE INDEX memory_facts_embedding_hnsw ON memory_facts USING hnsw (embedding vector_cosine_ops);
CREATE INDEX memory_facts_tsv_gin ON memory_facts USING gin (tsv);
CREATE INDEX memory_facts_current ON memory_facts (user_id, attribute) WHERE status = 'current';
CREATE INDEX memory_facts_user_recent ON memory_facts (user_id, recorded_at DESC) WHERE status = 'current';
CREATE INDEX memory_facts_lineage ON memory_facts (lineage_id, version);
-- The projection loads the versions a batch targets by id alone.
CREATE INDEX memory_facts_fact_id ON memory_facts (fact_id);
