-- Forgetting (MemoryForgotten): a forgotten edge is closed and flagged, so the graph shows it
-- neither now nor as of any date; a fact keeps notes such as "one of its sources was forgotten".
-- (A forgotten fact is a version with status 'forgotten'; a forgotten episode's row is deleted.)
ALTER TABLE memory_edges ADD COLUMN forgotten boolean NOT NULL DEFAULT false;
ALTER TABLE memory_facts ADD COLUMN notes text[] NOT NULL DEFAULT '{}';
ALTER TABLE memory_facts DROP CONSTRAINT memory_facts_status_check,
    ADD CONSTRAINT memory_facts_status_check CHECK (status IN ('current', 'superseded', 'deleted', 'forgotten'));
