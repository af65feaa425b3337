-- The reforms run from this deployment's log: a reform registers its topic when it starts and
-- marks it finished when it ends, so a topic a crashed reform left partway is told from a
-- whole one (replay refuses it; the next reform into it says to delete it first).
CREATE TABLE reforms (
    topic       text        PRIMARY KEY,
    extractor   text        NOT NULL,
    since       timestamptz,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    report      jsonb
);
