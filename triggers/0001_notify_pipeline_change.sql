-- The doorbell: `{id, status, operation}` on `pipeline_events` for every
-- insert and every status change, never the row itself (payloads must stay
-- under 8000 bytes, and the table is the truth). Re-applied idempotently.
CREATE OR REPLACE FUNCTION notify_pipeline_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pipeline_events',
        json_build_object('id', NEW.id, 'status', NEW.status, 'operation', TG_OP)::text);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS pipeline_runs_notify_insert ON pipeline_runs;
CREATE TRIGGER pipeline_runs_notify_insert
    AFTER INSERT ON pipeline_runs
    FOR EACH ROW EXECUTE FUNCTION notify_pipeline_change();

DROP TRIGGER IF EXISTS pipeline_runs_notify_update ON pipeline_runs;
CREATE TRIGGER pipeline_runs_notify_update
    AFTER UPDATE OF status ON pipeline_runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION notify_pipeline_change();
