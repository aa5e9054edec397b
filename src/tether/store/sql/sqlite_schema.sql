-- tether schema for SQLite. Applied idempotently when a store opens.
CREATE TABLE IF NOT EXISTS tether_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The task index: one row per task, with its lease (owner, expiry, fencing token).
CREATE TABLE IF NOT EXISTS tasks (
    task_id      TEXT PRIMARY KEY,
    agent        TEXT NOT NULL,
    status       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    head_version INTEGER NOT NULL,
    reason       TEXT,
    wake_at      REAL,
    lease_owner  TEXT,
    lease_until  REAL,
    fence        INTEGER NOT NULL DEFAULT 0,
    crashes      INTEGER NOT NULL DEFAULT 0,
    max_epoch    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, wake_at);
-- Only unfinished tasks: what workers look through, however many finished tasks pile up.
CREATE INDEX IF NOT EXISTS tasks_open ON tasks (status, wake_at)
    WHERE status IN ('pending', 'running', 'waiting', 'paused', 'needs_human');
-- Tasks with work and no holder: what a claim looks for first, never stepping over leased ones.
CREATE INDEX IF NOT EXISTS tasks_unleased ON tasks (status)
    WHERE status IN ('pending', 'running') AND wake_at IS NULL AND lease_owner IS NULL;
-- Tasks still owned by a worker: the ones whose lease ran out are recovered first.
CREATE INDEX IF NOT EXISTS tasks_orphaned ON tasks (lease_until) WHERE lease_owner IS NOT NULL;

-- Snapshot heads, versioned; the newest N are kept. A new version is written over the row
-- of the one that falls out, so the index holds only the task (schema 7): a key holding
-- the version would be rewritten on every step. A task's versions are unique because each
-- is one more than its head's, chosen under the task's fence and the file's write lock.
CREATE TABLE IF NOT EXISTS snapshots (
    task_id    TEXT NOT NULL,
    version    INTEGER NOT NULL,
    created_at REAL NOT NULL,
    head       BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_by_task ON snapshots (task_id);

-- The dialog, append-only. A rollback starts a new epoch instead of rewriting rows.
CREATE TABLE IF NOT EXISTS history (
    task_id    TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    entry      BLOB NOT NULL,
    PRIMARY KEY (task_id, epoch, seq)
);

-- The event inbox. Processed rows stay: they are the durable dedup memory.
CREATE TABLE IF NOT EXISTS events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id         TEXT NOT NULL,
    type            TEXT NOT NULL,
    priority        INTEGER NOT NULL,
    payload         BLOB,
    source_event_id TEXT,
    coalesce_class  TEXT,
    control         INTEGER NOT NULL DEFAULT 0,  -- a lever (resume, rollback, cancel): wakes parked tasks
    status          TEXT NOT NULL DEFAULT 'pending',
    created_at      REAL NOT NULL,
    done_at         REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS events_dedup ON events (task_id, source_event_id)
    WHERE source_event_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_pending ON events (task_id, status, priority, id);

-- What is known of each tool call's outcome, and which call it was. A task's records are
-- found by their keys, which all begin with the task's id and a colon (schema 7: no index
-- by task, one page fewer to write a call).
CREATE TABLE IF NOT EXISTS idempotency (
    key        TEXT PRIMARY KEY,
    task_id    TEXT NOT NULL,
    tool       TEXT NOT NULL,
    args_hash  TEXT NOT NULL,
    status     TEXT NOT NULL,
    result     BLOB,
    error      TEXT,
    attempts   INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL
);

-- One structured record per recovery action (R23).
CREATE TABLE IF NOT EXISTS recovery_log (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id  TEXT NOT NULL,
    at       REAL NOT NULL,
    record   BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS recovery_by_task ON recovery_log (task_id);

-- Large values (documents, images, base64) that snapshot heads refer to by digest (R20).
CREATE TABLE IF NOT EXISTS blobs (
    digest     TEXT PRIMARY KEY,
    data       BLOB NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;

-- Named limits shared by every worker: one row per limit and key, locked by whoever admits a
-- call under it, and the time a provider's 429 blocks it until.
CREATE TABLE IF NOT EXISTS limit_locks (
    name          TEXT NOT NULL,
    key           TEXT NOT NULL,
    blocked_until REAL,
    size          TEXT,  -- the limit as its workers define it, JSON (schema 5)
    PRIMARY KEY (name, key)
) WITHOUT ROWID;
-- Calls (or plans) holding a slot of a concurrency limit; a hold counts while its task is
-- still leased under the same fence, so a dead worker's holds end when its task is taken over.
CREATE TABLE IF NOT EXISTS limit_holds (
    name    TEXT NOT NULL,
    key     TEXT NOT NULL,
    holder  TEXT NOT NULL,
    task_id TEXT NOT NULL,
    fence   INTEGER NOT NULL,
    since   REAL NOT NULL,
    PRIMARY KEY (name, key, holder)
) WITHOUT ROWID;
-- Tasks held back by a limit, served by priority, then by how long they have waited; a row
-- whose task stopped asking (it expires a little after its next try) no longer counts.
CREATE TABLE IF NOT EXISTS limit_waiters (
    name     TEXT NOT NULL,
    key      TEXT NOT NULL,
    task_id  TEXT NOT NULL,
    priority INTEGER NOT NULL,
    since    REAL NOT NULL,
    expires  REAL NOT NULL,
    PRIMARY KEY (name, key, task_id)
) WITHOUT ROWID;
-- When each call under a rate or token limit was admitted (and the tokens it reported),
-- for the sliding windows.
CREATE TABLE IF NOT EXISTS limit_grants (
    name   TEXT NOT NULL,
    key    TEXT NOT NULL,
    at     REAL NOT NULL,
    holder TEXT NOT NULL,
    tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS limit_grants_by_time ON limit_grants (name, key, at);

-- Cron schedules that start tasks; a worker that finds one due starts its runs (task ids
-- made from the schedule and the time, so two workers start a run once) and moves next_at.
CREATE TABLE IF NOT EXISTS schedules (
    name        TEXT PRIMARY KEY,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    agent       TEXT NOT NULL,
    input       BLOB NOT NULL,
    catch_up    INTEGER NOT NULL,
    paused      INTEGER NOT NULL,
    next_at     REAL,
    last_run_at REAL,
    created_at  REAL NOT NULL,
    claimed_until REAL  -- held by a worker starting its runs until then (schema 5)
);
CREATE INDEX IF NOT EXISTS schedules_due ON schedules (next_at);

-- LangGraph checkpoints kept by TetherSaver (schema 6; tether.store.graph_checkpoints): a
-- checkpoint without its channel values, each channel's value as a blob when it changes
-- (a list may be stored as what it added to an earlier version), and the writes of the
-- tasks that ran after a checkpoint.
CREATE TABLE IF NOT EXISTS graph_checkpoints (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_id     TEXT,
    run_id        TEXT,
    kind          TEXT NOT NULL,
    checkpoint    BLOB NOT NULL,
    metadata_kind TEXT NOT NULL,
    metadata      BLOB NOT NULL,
    versions      TEXT NOT NULL,  -- JSON: channel -> the version of it read
    created_at    REAL NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX IF NOT EXISTS graph_checkpoints_by_run ON graph_checkpoints (run_id);
CREATE TABLE IF NOT EXISTS graph_blobs (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel       TEXT NOT NULL,
    version       TEXT NOT NULL,
    root          TEXT NOT NULL,  -- the whole blob a chain of additions starts from
    base          TEXT,           -- the version this one adds to (NULL: whole)
    keep_items    INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    value         BLOB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);
CREATE INDEX IF NOT EXISTS graph_blobs_chain ON graph_blobs (thread_id, checkpoint_ns, channel, root);
CREATE TABLE IF NOT EXISTS graph_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    kind          TEXT NOT NULL,
    value         BLOB NOT NULL,
    task_path     TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
