-- When the user last said each fact (``FactDecision.said_at``: the turn's own time, or its log
-- time if earlier): a decay sweep's idle time runs from it, so a backfill of old conversations
-- ages by their dates. Rows from before it have their last observation's log time, as before.
ALTER TABLE memory_facts ADD COLUMN last_said_at timestamptz;
UPDATE memory_facts SET last_said_at = last_observed_at;
