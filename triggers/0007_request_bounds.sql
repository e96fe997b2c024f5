-- The bounds of what only a producer writes into a request: its query, its
-- callback address and its metadata, checked on the INSERT and on an
-- UPDATE that sets one of them, and on no other statement (the daemon's
-- claims and finishes never set them; sql/0034_request_bounds_where_written.sql
-- says why they are not CHECK constraints). A value outside them is
-- refused as the constraints refused it (SQLSTATE 23514 with the
-- constraint's name and the table), and the refusal also names the column
-- and the size. Re-applied idempotently.

-- Raises the refusal of `bound` for a row of `tab` in `sch`; the bounds are
-- named as sql/0001_pipeline.sql, sql/0004_ops.sql and
-- sql/0014_metadata_and_run_lease.sql named their constraints.
CREATE OR REPLACE FUNCTION refuse_request_bound(sch text, tab text, bound text, col text, detail text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tab, bound
        USING ERRCODE = 'check_violation', CONSTRAINT = bound, TABLE = tab,
              SCHEMA = sch, COLUMN = col, DETAIL = detail;
END
$$;

-- A NULL passes, as in a CHECK. The sizes are counted as
-- sql/0027_size_checks_without_detoasting.sql counts them: bytes from the
-- header first, characters only above the limit.
CREATE OR REPLACE FUNCTION check_request_bounds() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF btrim(NEW.user_query) = '' THEN
        PERFORM refuse_request_bound(TG_TABLE_SCHEMA, TG_TABLE_NAME, 'pipeline_runs_query_not_empty', 'user_query',
                                     'user_query is empty or only white space');
    END IF;
    IF NOT (octet_length(NEW.user_query) <= 100000 OR length(NEW.user_query) <= 100000) THEN
        PERFORM refuse_request_bound(TG_TABLE_SCHEMA, TG_TABLE_NAME, 'pipeline_runs_query_size', 'user_query',
                                     format('user_query has %s characters; at most 100000 are accepted',
                                            length(NEW.user_query)));
    END IF;
    IF NOT (NEW.callback_url ~ '^https?://[^[:space:]]+$' AND length(NEW.callback_url) <= 2048) THEN
        PERFORM refuse_request_bound(TG_TABLE_SCHEMA, TG_TABLE_NAME, 'pipeline_runs_callback_url_valid', 'callback_url',
                                     'callback_url must be an http:// or https:// address without white space, '
                                     || 'at most 2048 characters');
    END IF;
    IF jsonb_typeof(NEW.metadata) <> 'object' THEN
        PERFORM refuse_request_bound(TG_TABLE_SCHEMA, TG_TABLE_NAME, 'pipeline_runs_metadata_object', 'metadata',
                                     format('metadata is a JSON %s, not an object', jsonb_typeof(NEW.metadata)));
    END IF;
    IF octet_length(NEW.metadata::text) > 16384 THEN
        PERFORM refuse_request_bound(TG_TABLE_SCHEMA, TG_TABLE_NAME, 'pipeline_runs_metadata_size', 'metadata',
                                     format('metadata is %s bytes as JSON text; at most 16384 are accepted',
                                            octet_length(NEW.metadata::text)));
    END IF;
    RETURN NEW;
END
$$;

-- maas's search_path for both (sql/0035_no_trust_in_the_caller.sql): they
-- run as the inserting role, which must not choose what `btrim` or
-- `refuse_request_bound` are. One setting switched per checked row.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION refuse_request_bound(text, text, text, text, text) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION check_request_bounds() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;

-- Named to fire after the other BEFORE triggers of an INSERT (they fire in
-- the order of their names: pipeline_runs_assign_tenant,
-- pipeline_runs_forgotten_guard), so it sees the row as it will be written,
-- as a constraint would, and a row the forget guard refuses is refused for
-- that.
DROP TRIGGER IF EXISTS pipeline_runs_producer_bounds ON pipeline_runs;
CREATE TRIGGER pipeline_runs_producer_bounds
    BEFORE INSERT OR UPDATE OF user_query, callback_url, metadata ON pipeline_runs
    FOR EACH ROW EXECUTE FUNCTION check_request_bounds();
