-- Keyword channel, postings: one narrow row per (user, word, time, row) for every episode and
-- every current fact, kept by triggers in the transaction that writes the row (a derived index,
-- like the GIN one: a replay rebuilds it with the rows, and the replay comparison checks it).
-- The keyword query then reads the user's recent rows that contain a query word from these
-- primary keys alone (index-only scans), instead of fetching the user's newest 1,000 wide rows
-- and matching each one's tsvector (10k-row user: executing 3.1 -> 1.2 ms, BENCHMARKS.md).
-- Words are the tsvector's lexemes without the user lexeme of 0005, and only up to 200 bytes: a
-- btree key holds at most ~2.7 kB, and a 1 kB user id with a 2 kB lexeme would not fit (nobody
-- asks for a 200-byte word; the all-words GIN path still sees it).
CREATE FUNCTION memstream_terms(tsv tsvector, user_id text) RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT array(SELECT t FROM unnest(tsvector_to_array(tsv)) t
                WHERE t <> 'u' || md5(user_id) AND octet_length(t) <= 200) $$;

CREATE TABLE episodes_terms (
    user_id    text        NOT NULL,
    term       text        NOT NULL,
    at         timestamptz NOT NULL,  -- episodes.occurred_at: the keyword window's order
    episode_id uuid        NOT NULL,
    PRIMARY KEY (user_id, term, at, episode_id)
);
CREATE TABLE memory_facts_terms (
    user_id text        NOT NULL,
    term    text        NOT NULL,
    at      timestamptz NOT NULL,     -- memory_facts.recorded_at
    fact_id uuid        NOT NULL,
    PRIMARY KEY (user_id, term, at, fact_id)
);

-- search_path is fixed at creation: the triggers write this schema's tables whatever the session's.
CREATE FUNCTION episodes_terms_sync() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM episodes_terms WHERE user_id = OLD.user_id AND term = ANY(memstream_terms(OLD.tsv, OLD.user_id))
           AND at = OLD.occurred_at AND episode_id = OLD.episode_id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO episodes_terms SELECT NEW.user_id, t, NEW.occurred_at, NEW.episode_id
        FROM unnest(memstream_terms(NEW.tsv, NEW.user_id)) t;
    END IF;
    RETURN NULL;
END $$;

-- Only current facts are searched: a fact's postings come and go with its status.
CREATE FUNCTION memory_facts_terms_sync() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.status = 'current' AND NEW.status = 'current' AND OLD.tsv = NEW.tsv
           AND OLD.recorded_at = NEW.recorded_at THEN
            RETURN NULL;  -- reinforcement, confidence, ...: the postings stand
        END IF;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        IF OLD.status = 'current' THEN
            DELETE FROM memory_facts_terms WHERE user_id = OLD.user_id
               AND term = ANY(memstream_terms(OLD.tsv, OLD.user_id)) AND at = OLD.recorded_at AND fact_id = OLD.fact_id;
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF NEW.status = 'current' THEN
            INSERT INTO memory_facts_terms SELECT NEW.user_id, t, NEW.recorded_at, NEW.fact_id
            FROM unnest(memstream_terms(NEW.tsv, NEW.user_id)) t;
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER episodes_terms AFTER INSERT OR DELETE OR UPDATE OF user_message, assistant_message, occurred_at, user_id
    ON episodes FOR EACH ROW EXECUTE FUNCTION episodes_terms_sync();
CREATE TRIGGER memory_facts_terms AFTER INSERT OR DELETE OR UPDATE
    ON memory_facts FOR EACH ROW EXECUTE FUNCTION memory_facts_terms_sync();

INSERT INTO episodes_terms SELECT user_id, t, occurred_at, episode_id
FROM episodes, unnest(memstream_terms(tsv, user_id)) t;
INSERT INTO memory_facts_terms SELECT user_id, t, recorded_at, fact_id
FROM memory_facts, unnest(memstream_terms(tsv, user_id)) t WHERE status = 'current';
