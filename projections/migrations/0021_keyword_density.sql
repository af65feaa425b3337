-- The keyword channel scores a long turn by how densely it holds the message's words: each
-- episode's postings carry its number of distinct words (its tsvector's lexemes, less the user's),
-- so the ranking can divide a turn's score by how many times longer than a short turn it is
-- (projections/fulltext.py) without reading the turn. Short turns are scored as before. Carried
-- in the primary key's index (INCLUDE), so the postings are still read index-only. The backfill
-- rewrites every posting in one transaction: on a large store, run `memstream migrate` with the
-- workers stopped and expect keyword reads to wait for it.
ALTER TABLE episodes_terms ADD COLUMN words int NOT NULL DEFAULT 0;
UPDATE episodes_terms p SET words = length(e.tsv) - 1 FROM episodes e
WHERE e.user_id = p.user_id AND e.episode_id = p.episode_id;
ALTER TABLE episodes_terms ALTER COLUMN words DROP DEFAULT;
ALTER TABLE episodes_terms DROP CONSTRAINT episodes_terms_pkey;
ALTER TABLE episodes_terms ADD CONSTRAINT episodes_terms_pkey PRIMARY KEY (user_id, term, at, episode_id) INCLUDE (words);

CREATE OR REPLACE FUNCTION episodes_terms_sync() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM episodes_terms WHERE user_id = OLD.user_id AND term = ANY(memstream_terms(OLD.tsv, OLD.user_id))
           AND at = OLD.occurred_at AND episode_id = OLD.episode_id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO episodes_terms SELECT NEW.user_id, t, NEW.occurred_at, NEW.episode_id, length(NEW.tsv) - 1
        FROM unnest(memstream_terms(NEW.tsv, NEW.user_id)) t;
    END IF;
    RETURN NULL;
END $$;

-- The all-words part for a search within a period (``since`` / ``until``): the period filters the
-- rows before the cap, so a user with more matches than the cap elsewhere still gets this period's.
CREATE FUNCTION episodes_all_words_between(p_user text, p_query tsquery, p_cap int, p_since timestamptz,
                                           p_until timestamptz)
RETURNS TABLE (episode_id uuid, tsv tsvector, at timestamptz) LANGUAGE sql STABLE ROWS 200
SET search_path FROM CURRENT SET plan_cache_mode = force_custom_plan AS $$
    SELECT t.episode_id, t.tsv, t.occurred_at FROM episodes t
    WHERE t.user_id = p_user AND t.tsv @@ p_query AND t.occurred_at >= p_since AND t.occurred_at < p_until
    LIMIT p_cap
$$;
