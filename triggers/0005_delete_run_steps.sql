-- Deleting a run deletes its step history (what ON DELETE CASCADE did
-- before sql/0006_steps_without_fk.sql), whoever deletes it: retention,
-- maasctl, a psql DELETE. One statement per DELETE statement, over its
-- transition table. Re-applied idempotently.
CREATE OR REPLACE FUNCTION delete_run_steps() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pipeline_steps s USING removed r WHERE s.run_id = r.id;
    RETURN NULL;
END
$$;

-- maas's search_path, as for every trigger function
-- (sql/0035_no_trust_in_the_caller.sql).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION delete_run_steps() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;

DROP TRIGGER IF EXISTS pipeline_runs_delete_steps ON pipeline_runs;
CREATE TRIGGER pipeline_runs_delete_steps
    AFTER DELETE ON pipeline_runs
    REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION delete_run_steps();
