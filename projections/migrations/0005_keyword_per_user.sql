-- Keyword channel, per user: each tsvector also carries one lexeme naming its user, so the GIN
-- index intersects "these words" with "this user" instead of finding every user's matches and
-- filtering afterwards (no btree_gin needed). Queries AND the user lexeme into their tsquery.
ALTER TABLE episodes DROP COLUMN tsv;
ALTER TABLE episodes ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    to_tsvector('english', user_message || ' ' || assistant_message)
    || array_to_tsvector(ARRAY['u' || md5(user_id)])) STORED;
CREATE INDEX episodes_tsv_gin ON episodes USING gin (tsv);

ALTER TABLE memory_facts DROP COLUMN tsv;
ALTER TABLE memory_facts ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    to_tsvector('english', text) || array_to_tsvector(ARRAY['u' || md5(user_id)])) STORED;
CREATE INDEX memory_facts_tsv_gin ON memory_facts USING gin (tsv);
CREATE INDEX memory_facts_user_recent ON memory_facts (user_id, recorded_at DESC) WHERE status = 'current';
