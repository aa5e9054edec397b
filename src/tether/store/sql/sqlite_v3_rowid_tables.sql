-- Schema 2 -> 3: snapshots and history become rowid tables.
-- In a WITHOUT ROWID table every append split pages three ways, and a ~2 KB head spilled to
-- an overflow page that was freed again a few steps later: about 16 WAL frames to fsync per
-- step. As rowid tables, appends fill pages in order and a head is rewritten in place in
-- the row of the version it replaces (about 9 frames). One transaction: all or nothing.
BEGIN IMMEDIATE;
ALTER TABLE snapshots RENAME TO snapshots_v2;
CREATE TABLE snapshots (
    task_id    TEXT NOT NULL,
    version    INTEGER NOT NULL,
    created_at REAL NOT NULL,
    head       BLOB NOT NULL,
    PRIMARY KEY (task_id, version)
);
INSERT INTO snapshots (task_id, version, created_at, head)
    SELECT task_id, version, created_at, head FROM snapshots_v2 ORDER BY task_id, version;
DROP TABLE snapshots_v2;
ALTER TABLE history RENAME TO history_v2;
CREATE TABLE history (
    task_id    TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    entry      BLOB NOT NULL,
    PRIMARY KEY (task_id, epoch, seq)
);
INSERT INTO history (task_id, epoch, seq, entry)
    SELECT task_id, epoch, seq, entry FROM history_v2 ORDER BY task_id, epoch, seq;
DROP TABLE history_v2;
UPDATE tether_meta SET value = '3' WHERE key = 'schema_version';
COMMIT;
