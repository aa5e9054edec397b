-- tether schema for PostgreSQL, migration 11: a task's idempotency records found by their
-- keys (issue 30).
--
-- Every key begins with its task's id and a colon, so a task's records are the range of keys
-- from '<id>:' up to '<id>;' (tether.store.queries._OF_TASK, which SQLite answers from the
-- key's index alone). The range must compare bytes, so the key column takes the "C"
-- collation (its primary-key index is rebuilt with it; equality, all the checkpoint function
-- asks of it, is unchanged). The index by task stays: workers of the previous release, still
-- running while this one rolls out, look records up by task alone.

ALTER TABLE idempotency ALTER COLUMN key TYPE TEXT COLLATE "C";
