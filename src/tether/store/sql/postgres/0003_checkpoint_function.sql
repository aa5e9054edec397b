-- tether schema for PostgreSQL, migration 3: a checkpoint in one round trip (issue 15).
--
-- A checkpoint used to take five round trips (BEGIN, lock and check the fence, read the
-- newest version, the writes, COMMIT); a step cost 6-7x a raw one-row commit. This function
-- does the same writes in the same order, in the caller's transaction: called on its own in
-- autocommit it is the whole transaction, so one round trip; several tasks' checkpoints
-- share one transaction by being called one after another in a pipeline (group commit).
--
-- Failures are raised with tether's own SQLSTATEs, so nothing of the transaction lands:
-- TT404 the task is not there, TT409 its fence moved (the message is the current fence).
-- Every statement takes a fresh snapshot (the function is VOLATILE), so events stored by
-- another transaction just before this one locked the task's row are seen by the last part,
-- which keeps them from being stranded (tether.store.steps.settle_inbox, the same rule).
CREATE OR REPLACE FUNCTION tether_checkpoint(
    p_task TEXT, p_fence BIGINT, p_now DOUBLE PRECISION, p_keep BIGINT, p_head BYTEA,
    p_status TEXT, p_reason TEXT, p_wake_at DOUBLE PRECISION, p_lease DOUBLE PRECISION,
    p_progress BOOLEAN,
    p_blob_digests TEXT[], p_blob_data BYTEA[],
    p_epochs INTEGER[], p_seqs INTEGER[], p_entries BYTEA[],
    p_done_ids BIGINT[], p_done_as TEXT[],
    p_keys TEXT[], p_call_tasks TEXT[], p_tools TEXT[], p_hashes TEXT[], p_call_status TEXT[],
    p_results BYTEA[], p_errors TEXT[], p_attempts INTEGER[],
    p_log BYTEA[],
    p_wakes TEXT  -- which pending events make the task due at once: NULL, 'urgent', 'levers'
) RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held_fence BIGINT;
    held_head BIGINT;
    new_version BIGINT;
BEGIN
    SELECT fence, head_version INTO held_fence, held_head FROM tasks
     WHERE task_id = p_task FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TT404', MESSAGE = p_task;
    END IF;
    IF held_fence <> p_fence THEN
        RAISE EXCEPTION USING ERRCODE = 'TT409', MESSAGE = held_fence::TEXT;
    END IF;
    -- past the head and every version kept, so a number is never reused
    SELECT GREATEST(held_head, COALESCE(MAX(version), 0)) + 1 INTO new_version
      FROM snapshots WHERE task_id = p_task;
    INSERT INTO snapshots (task_id, version, created_at, head)
    VALUES (p_task, new_version, p_now, p_head);
    IF cardinality(p_blob_digests) > 0 THEN  -- (an empty statement still costs its start-up)
        INSERT INTO blobs (digest, data, created_at)
        SELECT d, b, p_now FROM unnest(p_blob_digests, p_blob_data) AS x(d, b)
            ON CONFLICT (digest) DO NOTHING;
    END IF;
    IF cardinality(p_epochs) > 0 THEN
        INSERT INTO history (task_id, epoch, seq, entry)
        SELECT p_task, e, s, b FROM unnest(p_epochs, p_seqs, p_entries) AS x(e, s, b);
    END IF;
    IF cardinality(p_done_ids) > 0 THEN
        UPDATE events SET status = x.disposition, done_at = p_now
          FROM unnest(p_done_ids, p_done_as) AS x(id, disposition)
         WHERE events.id = x.id AND events.task_id = p_task;
    END IF;
    IF cardinality(p_keys) > 0 THEN
        INSERT INTO idempotency (key, task_id, tool, args_hash, status, result, error, attempts,
                                 updated_at)
        SELECT k, t, tl, h, s, r, e, a, p_now
          FROM unnest(p_keys, p_call_tasks, p_tools, p_hashes, p_call_status, p_results, p_errors,
                      p_attempts) AS x(k, t, tl, h, s, r, e, a)
            ON CONFLICT (key) DO UPDATE SET tool = excluded.tool, args_hash = excluded.args_hash,
               status = excluded.status, result = excluded.result, error = excluded.error,
               attempts = excluded.attempts, updated_at = excluded.updated_at;
    END IF;
    IF cardinality(p_log) > 0 THEN
        INSERT INTO recovery_log (task_id, at, record)
        SELECT p_task, p_now, r FROM unnest(p_log) AS x(r);
    END IF;
    UPDATE tasks SET status = p_status, updated_at = p_now, head_version = new_version,
           reason = p_reason, wake_at = p_wake_at,
           lease_until = date_part('epoch', clock_timestamp()) + p_lease,
           crashes = crashes * (NOT p_progress)::INTEGER  -- progress starts the count again
     WHERE task_id = p_task;
    IF new_version > p_keep THEN
        DELETE FROM snapshots WHERE task_id = p_task AND version <= new_version - p_keep;
    END IF;
    IF p_wakes IS NOT NULL THEN
        IF p_status IN ('completed', 'cancelled') THEN  -- queries.IGNORE_PENDING
            UPDATE events SET status = 'ignored', done_at = p_now
             WHERE task_id = p_task AND status = 'pending'
               AND NOT (control AND p_status = 'completed');
        END IF;
        IF EXISTS (SELECT 1 FROM events WHERE task_id = p_task AND status = 'pending'
                      AND (control OR (p_wakes = 'urgent' AND priority <= 2))) THEN
            UPDATE tasks SET wake_at = p_now WHERE task_id = p_task;  -- queries.URGENT / LEVERS
        END IF;
    END IF;
    RETURN new_version;
END
$$;
