-- tether schema for PostgreSQL, migration 1. The same rows as the SQLite store; times are
-- Unix seconds (double precision) so every backend orders and compares them alike.
CREATE TABLE tasks (
    task_id      TEXT PRIMARY KEY,
    agent        TEXT NOT NULL,
    status       TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    head_version BIGINT NOT NULL,
    reason       TEXT,
    wake_at      DOUBLE PRECISION,
    lease_owner  TEXT,
    lease_until  DOUBLE PRECISION,
    fence        BIGINT NOT NULL DEFAULT 0,
    crashes      INTEGER NOT NULL DEFAULT 0,
    max_epoch    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tasks_by_status ON tasks (status, wake_at);
CREATE INDEX tasks_open ON tasks (status, wake_at)
    WHERE status IN ('pending', 'running', 'waiting', 'paused', 'needs_human');
CREATE INDEX tasks_orphaned ON tasks (lease_until) WHERE lease_owner IS NOT NULL;

CREATE TABLE snapshots (
    task_id    TEXT NOT NULL,
    version    BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    head       BYTEA NOT NULL,
    PRIMARY KEY (task_id, version)
);

CREATE TABLE history (
    task_id TEXT NOT NULL,
    epoch   INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    entry   BYTEA NOT NULL,
    PRIMARY KEY (task_id, epoch, seq)
);

CREATE TABLE events (
    id              BIGSERIAL PRIMARY KEY,
    task_id         TEXT NOT NULL,
    type            TEXT NOT NULL,
    priority        INTEGER NOT NULL,
    payload         BYTEA,
    source_event_id TEXT,
    coalesce_class  TEXT,
    control         BOOLEAN NOT NULL DEFAULT FALSE,
    status          TEXT NOT NULL DEFAULT 'pending',
    created_at      DOUBLE PRECISION NOT NULL,
    done_at         DOUBLE PRECISION
);
CREATE UNIQUE INDEX events_dedup ON events (task_id, source_event_id)
    WHERE source_event_id IS NOT NULL;
CREATE INDEX events_pending ON events (task_id, status, priority, id);

CREATE TABLE idempotency (
    key        TEXT PRIMARY KEY,
    task_id    TEXT NOT NULL,
    tool       TEXT NOT NULL,
    args_hash  TEXT NOT NULL,
    status     TEXT NOT NULL,
    result     BYTEA,
    error      TEXT,
    attempts   INTEGER NOT NULL DEFAULT 0,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX idempotency_by_task ON idempotency (task_id);

CREATE TABLE recovery_log (
    id      BIGSERIAL PRIMARY KEY,
    task_id TEXT NOT NULL,
    at      DOUBLE PRECISION NOT NULL,
    record  BYTEA NOT NULL
);
CREATE INDEX recovery_by_task ON recovery_log (task_id);
