-- The logger's first half: every request's query lands in raw_logs in the
-- same transaction that inserts the request, whoever inserts it (HTTP or a
-- plain psql INSERT), exactly once.
CREATE OR REPLACE FUNCTION log_user_query() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content)
    VALUES (NEW.user_id, NEW.id, NEW.thread_id, 'user_query', NEW.user_query)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- It runs as its owner: a producer's INSERT sets it off, and a producer
-- holds INSERT on pipeline_runs and raw_logs only (sql/0020_tenant_roles.sql).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION log_user_query() SET search_path = %I, pg_temp', current_schema());
END
$$;

DROP TRIGGER IF EXISTS pipeline_runs_log_user_query ON pipeline_runs;
CREATE TRIGGER pipeline_runs_log_user_query
    AFTER INSERT ON pipeline_runs
    FOR EACH ROW EXECUTE FUNCTION log_user_query();
