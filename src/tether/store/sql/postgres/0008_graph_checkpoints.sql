-- LangGraph checkpoints kept by TetherSaver (see sqlite_schema.sql): a
-- checkpoint without its channel values, each channel's value as a blob when it changes
-- (a list may be stored as what it added to an earlier version), and the writes of the
-- tasks that ran after a checkpoint. Ids and versions compare byte by byte ("C"), as in
-- SQLite: checkpoint ids are time-ordered text.
CREATE TABLE graph_checkpoints (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT COLLATE "C" NOT NULL,
    parent_id     TEXT,
    run_id        TEXT,
    kind          TEXT NOT NULL,
    checkpoint    BYTEA NOT NULL,
    metadata_kind TEXT NOT NULL,
    metadata      BYTEA NOT NULL,
    versions      TEXT NOT NULL,  -- JSON: channel -> the version of it read
    created_at    DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX graph_checkpoints_by_run ON graph_checkpoints (run_id);
CREATE TABLE graph_blobs (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel       TEXT NOT NULL,
    version       TEXT COLLATE "C" NOT NULL,
    root          TEXT NOT NULL,  -- the whole blob a chain of additions starts from
    base          TEXT,           -- the version this one adds to (NULL: whole)
    keep_items    INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    value         BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);
CREATE INDEX graph_blobs_chain ON graph_blobs (thread_id, checkpoint_ns, channel, root);
CREATE TABLE graph_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT COLLATE "C" NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    kind          TEXT NOT NULL,
    value         BYTEA NOT NULL,
    task_path     TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
