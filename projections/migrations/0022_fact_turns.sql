-- The turns behind each fact version: the one it was read from, then every turn that observed it
-- again (``FactReinforced``), by event id. Forgetting a fact forgets these turns' episodes too
-- (issue 41: a forgotten fact's own words must not stay readable); ``observed_by`` holds decision
-- ids, which cannot be turned back into turns. Rows projected before this migration know only
-- their first turn until a replay rebuilds them.
ALTER TABLE memory_facts ADD COLUMN observed_in uuid[] NOT NULL DEFAULT '{}';
UPDATE memory_facts SET observed_in = ARRAY[source_event_id];
ALTER TABLE memory_facts ALTER COLUMN observed_in DROP DEFAULT;

-- Every version of one slot of a user: a new single-valued version ends the ended versions of its
-- slot it overlaps (projections/facts/core.py, ``slots``), as the graph does for its edges.
CREATE INDEX memory_facts_slot ON memory_facts (user_id, attribute);
