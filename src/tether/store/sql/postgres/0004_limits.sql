-- Named limits shared by every worker (see sqlite_schema.sql for what each table holds).
CREATE TABLE limit_locks (
    name          TEXT NOT NULL,
    key           TEXT NOT NULL,
    blocked_until DOUBLE PRECISION,
    PRIMARY KEY (name, key)
);
CREATE TABLE limit_holds (
    name    TEXT NOT NULL,
    key     TEXT NOT NULL,
    holder  TEXT NOT NULL,
    task_id TEXT NOT NULL,
    fence   BIGINT NOT NULL,
    since   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (name, key, holder)
);
CREATE TABLE limit_waiters (
    name     TEXT NOT NULL,
    key      TEXT NOT NULL,
    task_id  TEXT NOT NULL,
    priority INTEGER NOT NULL,
    since    DOUBLE PRECISION NOT NULL,
    expires  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (name, key, task_id)
);
CREATE TABLE limit_grants (
    name   TEXT NOT NULL,
    key    TEXT NOT NULL,
    at     DOUBLE PRECISION NOT NULL,
    holder TEXT NOT NULL,
    tokens BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX limit_grants_by_time ON limit_grants (name, key, at);
