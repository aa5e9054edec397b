-- tether schema for PostgreSQL, migration 9: a named limit's admission and release in one
-- round trip each (issue 30).
--
-- The shared steps (tether.store.limit_steps) took a statement per round trip, ten for an
-- admission, all while holding the limit's row lock: 5.9 ms of lock per admission on a local
-- server, so every worker asking for the same limit queued behind it and a concurrency limit
-- handed its slots over at a third of SQLite's rate. These functions take the same steps in
-- the same order, in the caller's transaction; called alone in autocommit, each is its own
-- transaction. Keep the two in step: tests/integration/test_postgres_limits.py runs one
-- script on both stores and requires the same answers.
--
-- A refusal says why as a code and a number ('blocked', 'full', 'ahead', 'rate', 'tokens';
-- tether.store.limit_steps.held_back words it). Waking a parked task notifies the channel the
-- workers listen on, as the steps' Notify does.

CREATE OR REPLACE FUNCTION tether_limit_wake(p_task TEXT, p_now DOUBLE PRECISION,
                                             p_channel TEXT) RETURNS VOID
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE tasks SET wake_at = p_now WHERE task_id = p_task AND lease_owner IS NULL;
    IF FOUND THEN
        PERFORM pg_notify(p_channel, p_task);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION tether_limit_hold_back(p_name TEXT, p_key TEXT, p_task TEXT,
                                                  p_priority INTEGER, p_now DOUBLE PRECISION,
                                                  p_retry_at DOUBLE PRECISION,
                                                  p_backstop DOUBLE PRECISION) RETURNS VOID
LANGUAGE plpgsql VOLATILE AS $$
BEGIN  -- the task waits in the limit's line until its retry time and the backstop after it
    INSERT INTO limit_waiters (name, key, task_id, priority, since, expires)
    VALUES (p_name, p_key, p_task, p_priority, p_now, p_retry_at + p_backstop)
    ON CONFLICT (name, key, task_id) DO UPDATE
       SET expires = excluded.expires,
           priority = LEAST(excluded.priority, limit_waiters.priority);
END $$;

CREATE OR REPLACE FUNCTION tether_limit_first_waiter(p_name TEXT, p_key TEXT) RETURNS TEXT
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    first_task TEXT;
BEGIN
    SELECT task_id INTO first_task FROM limit_waiters
     WHERE name = p_name AND key = p_key ORDER BY priority, since, task_id LIMIT 1;
    RETURN first_task;
END $$;

CREATE OR REPLACE FUNCTION tether_limit_drop_gone_waiters(p_name TEXT, p_key TEXT,
                                                          p_now DOUBLE PRECISION) RETURNS VOID
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM limit_waiters w
     WHERE w.name = p_name AND w.key = p_key
       AND (w.expires <= p_now OR NOT EXISTS (
            SELECT 1 FROM tasks t WHERE t.task_id = w.task_id
               AND t.status IN ('pending', 'running', 'waiting', 'paused', 'needs_human')));
END $$;

CREATE OR REPLACE FUNCTION tether_limit_window(p_name TEXT, p_key TEXT,
                                               p_after DOUBLE PRECISION, OUT admitted BIGINT,
                                               OUT tokens BIGINT, OUT oldest DOUBLE PRECISION)
LANGUAGE sql STABLE AS $$  -- the admissions since p_after, and the tokens they reported
    SELECT count(*), COALESCE(sum(g.tokens), 0)::bigint, min(g.at) FROM limit_grants g
     WHERE g.name = p_name AND g.key = p_key AND g.at > p_after
$$;

CREATE OR REPLACE FUNCTION tether_acquire_limit(
    p_name TEXT, p_key TEXT, p_task TEXT, p_fence BIGINT, p_holder TEXT, p_priority INTEGER,
    p_concurrency INTEGER, p_rate_count INTEGER, p_rate_seconds DOUBLE PRECISION,
    p_token_budget BIGINT, p_token_seconds DOUBLE PRECISION, p_size TEXT,
    p_now DOUBLE PRECISION, p_backstop DOUBLE PRECISION, p_channel TEXT,
    OUT granted BOOLEAN, OUT retry_at DOUBLE PRECISION, OUT reason TEXT,
    OUT amount DOUBLE PRECISION)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    blocked DOUBLE PRECISION;
    in_use BIGINT;
    my_since DOUBLE PRECISION;
    my_priority INTEGER;
    ahead TEXT;
    counted BIGINT;
BEGIN
    granted := FALSE;
    INSERT INTO limit_locks (name, key, blocked_until, size) VALUES (p_name, p_key, NULL, p_size)
    ON CONFLICT (name, key) DO UPDATE SET size = excluded.size
     WHERE limit_locks.size IS NULL OR limit_locks.size <> excluded.size;
    SELECT blocked_until INTO blocked FROM limit_locks
     WHERE name = p_name AND key = p_key FOR UPDATE;
    IF blocked IS NOT NULL AND blocked > p_now THEN
        retry_at := blocked;
        PERFORM tether_limit_hold_back(p_name, p_key, p_task, p_priority, p_now, retry_at,
                                       p_backstop);
        reason := 'blocked';
        RETURN;
    END IF;
    IF p_concurrency IS NOT NULL THEN
        DELETE FROM limit_holds h WHERE h.name = p_name AND h.key = p_key AND NOT EXISTS (
            SELECT 1 FROM tasks t WHERE t.task_id = h.task_id AND t.fence = h.fence
               AND t.lease_owner IS NOT NULL);
        IF EXISTS (SELECT 1 FROM limit_holds
                    WHERE name = p_name AND key = p_key AND holder = p_holder) THEN
            granted := TRUE;  -- taken already (a retried admission)
            RETURN;
        END IF;
        SELECT count(*) INTO in_use FROM limit_holds WHERE name = p_name AND key = p_key;
        IF in_use >= p_concurrency THEN
            retry_at := p_now + p_backstop;
            PERFORM tether_limit_hold_back(p_name, p_key, p_task, p_priority, p_now, retry_at,
                                           p_backstop);
            reason := 'full';
            amount := in_use;
            RETURN;
        END IF;
    END IF;
    PERFORM tether_limit_drop_gone_waiters(p_name, p_key, p_now);
    SELECT since, LEAST(priority, p_priority) INTO my_since, my_priority FROM limit_waiters
     WHERE name = p_name AND key = p_key AND task_id = p_task;
    IF NOT FOUND THEN
        my_since := p_now;
        my_priority := p_priority;
    END IF;
    SELECT task_id INTO ahead FROM limit_waiters
     WHERE name = p_name AND key = p_key AND task_id <> p_task
       AND (priority < my_priority OR (priority = my_priority AND since < my_since))
     ORDER BY priority, since, task_id LIMIT 1;
    IF ahead IS NOT NULL THEN  -- a slot is free: the one ahead takes it first
        PERFORM tether_limit_wake(ahead, p_now, p_channel);
        retry_at := p_now + p_backstop;
        PERFORM tether_limit_hold_back(p_name, p_key, p_task, p_priority, p_now, retry_at,
                                       p_backstop);
        reason := 'ahead';
        RETURN;
    END IF;
    IF p_rate_count IS NOT NULL OR p_token_budget IS NOT NULL THEN
        DELETE FROM limit_grants WHERE name = p_name AND key = p_key
           AND at <= p_now - GREATEST(COALESCE(p_rate_seconds, 0), COALESCE(p_token_seconds, 0));
        IF p_rate_count IS NOT NULL THEN
            SELECT w.admitted, w.oldest + p_rate_seconds INTO counted, retry_at
              FROM tether_limit_window(p_name, p_key, p_now - p_rate_seconds) w;
            reason := CASE WHEN counted >= p_rate_count THEN 'rate' END;
        END IF;
        IF reason IS NULL AND p_token_budget IS NOT NULL THEN
            SELECT w.tokens, w.oldest + p_token_seconds INTO counted, retry_at
              FROM tether_limit_window(p_name, p_key, p_now - p_token_seconds) w;
            reason := CASE WHEN counted >= p_token_budget THEN 'tokens' END;
        END IF;
        IF reason IS NOT NULL THEN  -- a window is full until its oldest admission leaves it
            amount := counted;
            PERFORM tether_limit_hold_back(p_name, p_key, p_task, p_priority, p_now, retry_at,
                                           p_backstop);
            RETURN;
        END IF;
        retry_at := NULL;
        INSERT INTO limit_grants (name, key, at, holder) VALUES (p_name, p_key, p_now, p_holder);
    END IF;
    IF p_concurrency IS NOT NULL THEN
        INSERT INTO limit_holds (name, key, holder, task_id, fence, since)
        VALUES (p_name, p_key, p_holder, p_task, p_fence, p_now)
        ON CONFLICT (name, key, holder) DO UPDATE
           SET task_id = excluded.task_id, fence = excluded.fence, since = excluded.since;
    END IF;
    DELETE FROM limit_waiters WHERE name = p_name AND key = p_key AND task_id = p_task;
    IF FOUND THEN  -- it was first in line: the next may fit too, and looks at once
        ahead := tether_limit_first_waiter(p_name, p_key);
        IF ahead IS NOT NULL THEN
            PERFORM tether_limit_wake(ahead, p_now, p_channel);
        END IF;
    END IF;
    granted := TRUE;
END $$;

CREATE OR REPLACE FUNCTION tether_release_limit(p_name TEXT, p_key TEXT, p_holder TEXT,
                                                p_now DOUBLE PRECISION, p_channel TEXT)
RETURNS VOID LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    first_task TEXT;
BEGIN
    DELETE FROM limit_holds WHERE name = p_name AND key = p_key AND holder = p_holder;
    PERFORM tether_limit_drop_gone_waiters(p_name, p_key, p_now);
    first_task := tether_limit_first_waiter(p_name, p_key);
    IF first_task IS NOT NULL THEN
        PERFORM tether_limit_wake(first_task, p_now, p_channel);
    END IF;
END $$;
