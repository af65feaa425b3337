-- Reflections (Tier 3): a sentence a model drew from several of the user's facts, kept as a fact
-- row (category 'reflection': ranked with facts by the read path, browsed, corrected, forgotten,
-- exported and decayed as facts are) that names its sources. It ends when one of them ends, so a
-- decision ending facts loads the reflections drawn from them: by this index, not a scan of the
-- user's facts.
ALTER TABLE memory_facts ADD COLUMN derived_from uuid[] NOT NULL DEFAULT '{}';
CREATE INDEX memory_facts_derived_from ON memory_facts USING gin (derived_from) WHERE category = 'reflection';

-- The last reflection sweep of each partition of the events topic (``memstream status``).
CREATE TABLE reflection_sweeps (
    topic      text        NOT NULL,
    partition  integer     NOT NULL,
    sweep_id   uuid        NOT NULL,
    swept_at   timestamptz NOT NULL,
    users      integer     NOT NULL,
    clusters   integer     NOT NULL,
    PRIMARY KEY (topic, partition)
);
