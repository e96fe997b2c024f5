-- The logger's first half: every request's query lands in raw_logs in the
-- same transaction that inserts the request, whoever inserts it (HTTP or a
-- plain psql INSERT), exactly once.
--
-- The log is numbered here, as raw_logs_track would number it (the same
-- upsert of the user's archive mark, triggers/0004_track_raw_logs.sql),
-- and inserted with its number by this function's owner, so the two
-- BEFORE INSERT triggers of raw_logs skip it: the request's forget guard
-- (pipeline_runs_forgotten_guard) already holds the user's erase lock to
-- the end of the transaction and found no tombstone, so the log's own
-- guard could only find the same. Two trigger calls fewer on every
-- request. A log that conflicts on its request (a request id whose query
-- is logged already: raw_logs_request_message_idx) is not written and
-- leaves a gap in the numbers, as a deleted turn does; a conflict on
-- anything else (a log's id, a user's number) is an error that refuses the
-- request, never a query silently not logged.
CREATE OR REPLACE FUNCTION log_user_query() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    seq bigint;
BEGIN
    INSERT INTO archive_marks AS m (user_id, logged_seq, pending_since, last_active_at)
    VALUES (NEW.user_id, 1, now(), now())
    ON CONFLICT (user_id) DO UPDATE
        SET logged_seq     = m.logged_seq + 1,
            pending_since  = coalesce(m.pending_since, EXCLUDED.pending_since),
            last_active_at = greatest(m.last_active_at, EXCLUDED.last_active_at)
    RETURNING m.logged_seq INTO seq;
    INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content, user_seq)
    VALUES (NEW.user_id, NEW.id, NEW.thread_id, 'user_query', NEW.user_query, seq)
    ON CONFLICT (request_id, message_type) WHERE request_id IS NOT NULL DO NOTHING;
    RETURN NULL;
END
$$;

-- It runs as its owner: a producer's INSERT sets it off, and a producer
-- holds INSERT on pipeline_runs and raw_logs only (sql/0020_tenant_roles.sql)
-- and no grant on archive_marks.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION log_user_query() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;

DROP TRIGGER IF EXISTS pipeline_runs_log_user_query ON pipeline_runs;
CREATE TRIGGER pipeline_runs_log_user_query
    AFTER INSERT ON pipeline_runs
    FOR EACH ROW EXECUTE FUNCTION log_user_query();
