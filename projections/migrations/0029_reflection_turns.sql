-- A reflection may be drawn from the user's own words as well as from their facts: the turns
-- (event ids) it rests on. Forgetting one of them forgets the reflection, so a forgotten turn
-- loads the reflections drawn from it: by this index, not a scan of the user's facts.
ALTER TABLE memory_facts ADD COLUMN derived_from_turns uuid[] NOT NULL DEFAULT '{}';
CREATE INDEX memory_facts_derived_from_turns ON memory_facts USING gin (derived_from_turns) WHERE category = 'reflection';
