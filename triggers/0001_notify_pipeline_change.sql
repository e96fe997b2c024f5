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
--
-- It runs with maas's search_path (set below, as for every trigger
-- function: sql/0035_no_trust_in_the_caller.sql), whoever's statement sets
-- it off (a producer's INSERT too). That is one more setting switched per
-- statement, next to the two planner settings: per statement, not per row.
-- maas_event is named with all its arguments, typed, so that no overload
-- can be a closer match.
CREATE OR REPLACE FUNCTION notify_pipeline_change() RETURNS trigger
LANGUAGE plpgsql
SET enable_nestloop = off
SET enable_mergejoin = off
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('pipeline_events', maas_event(n.id, n.status, 'INSERT'::text, false))
        FROM inserted n;
    ELSE
        PERFORM pg_notify('pipeline_events', maas_event(n.id, n.status, 'UPDATE'::text, false))
        FROM updated n JOIN previous o ON o.id = n.id
        WHERE o.status IS DISTINCT FROM n.status;
    END IF;
    RETURN NULL;
END
$$;

-- maas's search_path (CREATE OR REPLACE above cleared it).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION notify_pipeline_change() SET search_path = pg_catalog, %I, pg_temp', current_schema());
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
