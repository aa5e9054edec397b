-- Schema 6 -> 7 (issue 30): two index pages fewer to write a step.
-- A head is written over the row of the version that falls out of the kept ones; with the
-- version in the table's key, each such rewrite moved an index entry too. Now the only
-- index holds the task. And a task's idempotency records are found by their keys (all begin
-- with the task's id and a colon), so the index by task, one more insert per call, goes.
-- One transaction: all or nothing. The schema version is not raised here but once the whole
-- upgrade is done (sqlite_schema.create_or_upgrade): a store stopped between this rebuild and
-- the columns an older schema lacks must still be found behind and finished when next opened.
BEGIN IMMEDIATE;
ALTER TABLE snapshots RENAME TO snapshots_v6;
CREATE TABLE snapshots (
    task_id    TEXT NOT NULL,
    version    INTEGER NOT NULL,
    created_at REAL NOT NULL,
    head       BLOB NOT NULL
);
INSERT INTO snapshots (task_id, version, created_at, head)
    SELECT task_id, version, created_at, head FROM snapshots_v6 ORDER BY task_id, version;
DROP TABLE snapshots_v6;
CREATE INDEX snapshots_by_task ON snapshots (task_id);
DROP INDEX IF EXISTS idempotency_by_task;
COMMIT;
