-- tether schema for PostgreSQL, migration 10: a limit's slot handed over inside the worker
-- (issue 30).
--
-- A task held back by a concurrency limit may wait a short while in the memory of the worker
-- that runs it, still leased, instead of being parked (Settings.slot_wait). Letting a slot
-- go must then reach it: the release names the task first in line (the worker that let the
-- slot go hands it over at once if it holds that task), and a task another worker holds is
-- told by a notice of its own, 'slot/' and its id ('/' is never part of a task id), which
-- wakes that task's wait but not the workers' claim loops (nothing new can be claimed).
-- Keep in step with tether.store.limit_steps (release, _wake).

CREATE OR REPLACE FUNCTION tether_limit_wake(p_task TEXT, p_now DOUBLE PRECISION,
                                             p_channel TEXT) RETURNS VOID
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE tasks SET wake_at = p_now WHERE task_id = p_task AND lease_owner IS NULL;
    IF FOUND THEN
        PERFORM pg_notify(p_channel, p_task);
    ELSE
        PERFORM pg_notify(p_channel, 'slot/' || p_task);
    END IF;
END $$;

DROP FUNCTION IF EXISTS tether_release_limit(TEXT, TEXT, TEXT, DOUBLE PRECISION, TEXT);

CREATE FUNCTION tether_release_limit(p_name TEXT, p_key TEXT, p_holder TEXT,
                                     p_now DOUBLE PRECISION, p_channel TEXT)
RETURNS TEXT LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    first_task TEXT;
BEGIN
    DELETE FROM limit_holds WHERE name = p_name AND key = p_key AND holder = p_holder;
    PERFORM tether_limit_drop_gone_waiters(p_name, p_key, p_now);
    first_task := tether_limit_first_waiter(p_name, p_key);
    IF first_task IS NOT NULL THEN
        PERFORM tether_limit_wake(first_task, p_now, p_channel);
    END IF;
    RETURN first_task;
END $$;
