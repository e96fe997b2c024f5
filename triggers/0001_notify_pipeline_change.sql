-- The doorbell: `{id, status, operation}` on `pipeline_events` for every
-- insert and every status change, never the row itself (payloads must stay
-- under 8000 bytes, and the table is the truth). Re-applied idempotently.
--
-- Statement-level, over transition tables: one trigger call per statement
-- sends the notifications of all its rows, where a row-level trigger would
-- run a PL/pgSQL call and an SPI query per row (the daemon changes hundreds
-- of rows per statement). An UPDATE's old and new rows are paired by id,
-- with a hash join: the planner's other choices rescan a transition table
-- once per row.
CREATE OR REPLACE FUNCTION notify_pipeline_change() RETURNS trigger
LANGUAGE plpgsql
SET enable_nestloop = off
SET enable_mergejoin = off
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('pipeline_events', maas_event(n.id, n.status, 'INSERT'))
        FROM inserted n;
    ELSE
        PERFORM pg_notify('pipeline_events', maas_event(n.id, n.status, 'UPDATE'))
        FROM updated n JOIN previous o ON o.id = n.id
        WHERE o.status IS DISTINCT FROM n.status;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS pipeline_runs_notify_insert ON pipeline_runs;
CREATE TRIGGER pipeline_runs_notify_insert
    AFTER INSERT ON pipeline_runs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION notify_pipeline_change();

DROP TRIGGER IF EXISTS pipeline_runs_notify_update ON pipeline_runs;
CREATE TRIGGER pipeline_runs_notify_update
    AFTER UPDATE ON pipeline_runs
    REFERENCING OLD TABLE AS previous NEW TABLE AS updated
    FOR EACH STATEMENT EXECUTE FUNCTION notify_pipeline_change();
