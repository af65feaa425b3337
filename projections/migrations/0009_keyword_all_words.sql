-- The keyword channel's all-words part (projections/fulltext.py), one function per table: the
-- current rows of a user holding every word of a tsquery, through the GIN index.
--
-- Why a function: the reader runs the keyword statement with one generic plan per connection
-- (planning it cost ~1 ms a read). A generic plan costs "user_id = $1" as if every user were
-- average and ANDed the GIN bitmap with a btree scan of the user's whole (user_id, ...) index:
-- 1 ms for a 10k-row user, 9.5 ms for a 100k-row one (BENCHMARKS.md). Here the function is
-- planned for its arguments on every call (SET plan_cache_mode), and it is called only when the
-- statement needs the part at all. The filter must match the postings' (0008): current facts only.
CREATE FUNCTION memory_facts_all_words(p_user text, p_query tsquery, p_cap int)
RETURNS TABLE (fact_id uuid, tsv tsvector, at timestamptz) LANGUAGE sql STABLE ROWS 200
SET search_path FROM CURRENT SET plan_cache_mode = force_custom_plan AS $$
    SELECT t.fact_id, t.tsv, t.recorded_at FROM memory_facts t
    WHERE t.user_id = p_user AND t.tsv @@ p_query AND t.status = 'current' LIMIT p_cap
$$;

CREATE FUNCTION episodes_all_words(p_user text, p_query tsquery, p_cap int)
RETURNS TABLE (episode_id uuid, tsv tsvector, at timestamptz) LANGUAGE sql STABLE ROWS 200
SET search_path FROM CURRENT SET plan_cache_mode = force_custom_plan AS $$
    SELECT t.episode_id, t.tsv, t.occurred_at FROM episodes t
    WHERE t.user_id = p_user AND t.tsv @@ p_query LIMIT p_cap
$$;
