-- tether schema for PostgreSQL, migration 12: a checkpoint and the task's inbox after it in
-- one statement (issue 30).
--
-- A step's commit also reads what the task's next tick needs: its pending events. That read
-- was a second statement behind the tether_checkpoint call in one psycopg pipeline (one round
-- trip, but two statements to send, run and read back, and the pipeline's own bookkeeping,
-- about a third of the client's CPU a step). tether_checkpoint_reading makes the same call
-- and returns the events in its own transaction, read while the task's row is still locked
-- (so what it returns is the inbox as it stands once the checkpoint is written, as on
-- SQLite): one row per pending event, each carrying the new version, or one row of the
-- version alone when none is pending. The events' columns are queries._EVENT_COLUMNS' and
-- their order is queries.PENDING_EVENTS': keep them in step.

CREATE OR REPLACE FUNCTION tether_checkpoint_reading(
    p_task TEXT, p_fence BIGINT, p_now DOUBLE PRECISION, p_keep BIGINT, p_head BYTEA,
    p_status TEXT, p_reason TEXT, p_wake_at DOUBLE PRECISION, p_lease DOUBLE PRECISION,
    p_progress BOOLEAN,
    p_blob_digests TEXT[], p_blob_data BYTEA[],
    p_epochs INTEGER[], p_seqs INTEGER[], p_entries BYTEA[],
    p_done_ids BIGINT[], p_done_as TEXT[],
    p_keys TEXT[], p_call_tasks TEXT[], p_tools TEXT[], p_hashes TEXT[], p_call_status TEXT[],
    p_results BYTEA[], p_errors TEXT[], p_attempts INTEGER[],
    p_log BYTEA[], p_wakes TEXT, p_seen BIGINT[]
) RETURNS TABLE (version BIGINT, id BIGINT, task_id TEXT, type TEXT, priority INTEGER,
                 payload BYTEA, source_event_id TEXT, created_at DOUBLE PRECISION,
                 status TEXT, coalesce_class TEXT)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    written BIGINT;
BEGIN
    written := tether_checkpoint(p_task, p_fence, p_now, p_keep, p_head, p_status, p_reason,
        p_wake_at, p_lease, p_progress, p_blob_digests, p_blob_data, p_epochs, p_seqs,
        p_entries, p_done_ids, p_done_as, p_keys, p_call_tasks, p_tools, p_hashes,
        p_call_status, p_results, p_errors, p_attempts, p_log, p_wakes, p_seen);
    RETURN QUERY
        SELECT written, e.id, e.task_id, e.type, e.priority, e.payload, e.source_event_id,
               e.created_at, e.status, e.coalesce_class
          FROM (SELECT 1) AS always
          LEFT JOIN LATERAL (
              SELECT p.id, p.task_id, p.type, p.priority, p.payload, p.source_event_id,
                     p.created_at, p.status, p.coalesce_class
                FROM events AS p
               WHERE p.task_id = p_task AND p.status = 'pending'
               ORDER BY p.priority, p.id) AS e ON TRUE;
END $$;
