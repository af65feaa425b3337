-- Commands hosts put on the log (prospective memory, identities) and the Tier 1 profile.
CREATE TABLE reminders (
    reminder_id     uuid        PRIMARY KEY,
    user_id         text        NOT NULL,
    text            text        NOT NULL,
    due_at          timestamptz NOT NULL,
    status          text        NOT NULL CHECK (status IN ('pending', 'done', 'dismissed')),
    scheduled_at    timestamptz NOT NULL,   -- world time of the scheduling event
    resolved_at     timestamptz,            -- world time of the resolving event
    source_event_id uuid        NOT NULL
);
CREATE INDEX reminders_due ON reminders (user_id, status, due_at);

CREATE TABLE person_identities (
    user_id         text        PRIMARY KEY,
    attributes      jsonb       NOT NULL,
    updated_at      timestamptz NOT NULL,
    source_event_id uuid        NOT NULL
);

CREATE TABLE expert_identities (
    identity_id     text        PRIMARY KEY,
    name            text        NOT NULL,
    instructions    text        NOT NULL,
    attributes      jsonb,
    updated_at      timestamptz NOT NULL,
    source_event_id uuid        NOT NULL
);

-- Tier 1: a small profile per user, rebuilt from current facts in the facts projection's
-- transaction (so it is exactly as replayable as the facts), cached in Redis.
CREATE TABLE profiles (
    user_id text  PRIMARY KEY,
    profile jsonb NOT NULL,
    facts   int   NOT NULL
);
INSERT INTO projection_epochs VALUES ('commands', 1), ('profile', 1);
