-- Cron schedules that start tasks (see sqlite_schema.sql).
CREATE TABLE schedules (
    name        TEXT PRIMARY KEY,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    agent       TEXT NOT NULL,
    input       BYTEA NOT NULL,
    catch_up    INTEGER NOT NULL,
    paused      INTEGER NOT NULL,
    next_at     DOUBLE PRECISION,
    last_run_at DOUBLE PRECISION,
    created_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_at);
