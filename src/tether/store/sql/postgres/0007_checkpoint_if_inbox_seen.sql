-- tether schema for PostgreSQL, migration 7: a checkpoint that is written only if the inbox
-- holds nothing its runner has not seen (issue 30).
--
-- The same function as migration 3 with one more argument, p_seen: the ids of the pending
-- events the runner last read. When it is given and a pending event of the task is neither
-- among them nor consumed by this checkpoint, nothing is written and TT412 is raised. A
-- call's resume point is written so: a message that arrived while the model answered
-- reaches the task before the call starts, without a read of the inbox of its own (a round
-- trip a step). The 27-argument function of migration 3 stays for workers not yet upgraded,
-- as a call of this one with no condition (one body to keep, not two).
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
    p_wakes TEXT,  -- which pending events make the task due at once: NULL, 'urgent', 'levers'
    p_seen BIGINT[]  -- write only if no pending event is outside these (NULL: no condition)
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
    -- The task's row is locked: no event can be stored for it until this commits.
    IF p_seen IS NOT NULL AND EXISTS (
        SELECT 1 FROM events WHERE task_id = p_task AND status = 'pending'
           AND id <> ALL(p_seen) AND id <> ALL(p_done_ids)) THEN
        RAISE EXCEPTION USING ERRCODE = 'TT412', MESSAGE = p_task;
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
    p_wakes TEXT
) RETURNS BIGINT LANGUAGE sql VOLATILE AS $$
    SELECT tether_checkpoint(p_task, p_fence, p_now, p_keep, p_head, p_status, p_reason,
                             p_wake_at, p_lease, p_progress, p_blob_digests, p_blob_data,
                             p_epochs, p_seqs, p_entries, p_done_ids, p_done_as, p_keys,
                             p_call_tasks, p_tools, p_hashes, p_call_status, p_results,
                             p_errors, p_attempts, p_log, p_wakes, NULL::BIGINT[])
$$;
