-- Candidates the junk guard refused (``FactRefused``): what a turn was read to say and why it was
-- not kept, for the user's history and the inspector. Never read by the ranked read path. A
-- forgotten turn takes its refusals with it; a forgotten user, all of theirs.
CREATE TABLE fact_refusals (
    user_id          text        NOT NULL,
    decision_id      uuid        NOT NULL,
    source_event_id  uuid        NOT NULL,
    recorded_at      timestamptz NOT NULL,
    refusal          text        NOT NULL,
    reason           text        NOT NULL,
    text             text        NOT NULL,
    category         text        NOT NULL,
    attribute        text        NOT NULL,
    value            text        NOT NULL,
    evidence         text,
    extractor        text        NOT NULL,
    PRIMARY KEY (user_id, decision_id)
);
CREATE INDEX fact_refusals_turn ON fact_refusals (user_id, source_event_id);
CREATE INDEX fact_refusals_recent ON fact_refusals (user_id, recorded_at, decision_id);
