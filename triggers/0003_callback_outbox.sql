-- Callbacks: a terminal transition (COMPLETED, FAILED, CANCELLED) of a run
-- with a callback_url adds a delivery to callback_outbox in the same
-- transaction, whoever makes it (the daemon's fenced batch, maasctl, a psql
-- UPDATE), so no callback is ever missed. Rows without a callback_url never
-- reach the function: the WHEN clause filters them first.
-- Re-applied idempotently.
CREATE OR REPLACE FUNCTION enqueue_callback() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO callback_outbox (run_id, url, event, payload)
    VALUES (NEW.id, NEW.callback_url, 'request.' || lower(NEW.status),
            jsonb_build_object(
                'event', 'request.' || lower(NEW.status),
                'id', NEW.id,
                'status', NEW.status,
                -- The id the tenant knows its user by (sql/0012_tenants.sql).
                'user_id', coalesce(NEW.tenant_user_id, NEW.user_id),
                'thread_id', NEW.thread_id,
                'answer', NEW.final_answer,
                'error', NEW.error,
                'created_at', NEW.created_at,
                'finished_at', now()));
    RETURN NULL;
END
$$;

-- maas's search_path, as for every trigger function
-- (sql/0035_no_trust_in_the_caller.sql).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION enqueue_callback() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;

DROP TRIGGER IF EXISTS pipeline_runs_enqueue_callback ON pipeline_runs;
CREATE TRIGGER pipeline_runs_enqueue_callback
    AFTER UPDATE OF status ON pipeline_runs
    FOR EACH ROW
    WHEN (NEW.callback_url IS NOT NULL
          AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION enqueue_callback();
