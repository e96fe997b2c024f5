-- The bounds of the columns only a producer writes are checked when they
-- are written, not on every row version of the request.
--
-- PostgreSQL builds each CHECK constraint's expression from its stored
-- text once per statement that writes the table: it parses the text,
-- simplifies it and compiles it, whatever the statement changed. A
-- one-row statement pays for every constraint of the table, and the
-- daemon's one-row claims and finishes (a request at a time, as when the
-- service is not busy) were about half that work: a one-row UPDATE of a
-- copy of pipeline_runs took 0.45–0.49 ms with its 17 constraints and
-- 0.18–0.25 ms with none (pgbench, one client, BEGIN / UPDATE / ROLLBACK;
-- PostgreSQL 18 the same). The cost follows the expressions' stored size
-- (one constraint ANDing all 17 cost as much as the 17), so it is cut by
-- checking less on each statement, not by merging.
--
-- - The query, the callback address and the metadata are written by the
--   producer's INSERT and by nothing of the daemon's. Their five bounds
--   move to a trigger that fires on an INSERT and on an UPDATE that sets
--   one of those columns (triggers/0007_request_bounds.sql). A refusal is
--   the same as before: SQLSTATE 23514, the constraint's name, the table,
--   now also the column and the value's size. The claim, the finish and
--   the heartbeat no longer parse them, nor serialise the metadata to
--   measure it on every row version.
-- - pipeline_runs_attempt_valid (attempt >= 0) said again what
--   pipeline_runs_attempt_range says.
-- - pipeline_runs_time_range holds the same four times between the same
--   years, each named once (least and greatest skip a NULL lease time, as
--   the old `lease_expires_at IS NULL OR` did).
--
-- The bounds the daemon's own writes must hold (status, lease, attempt,
-- token, result sizes and shape) stay constraints. Measured on the same
-- copy: a one-row UPDATE 0.35–0.40 ms with the constraints left here,
-- against 0.45–0.49 with all 17; BENCHMARKS.md has the runs.
--
-- Every row holds the old conditions, and the new time bound is the same
-- condition, so validating it only scans.

ALTER TABLE pipeline_runs
    DROP CONSTRAINT pipeline_runs_query_not_empty,
    DROP CONSTRAINT pipeline_runs_query_size,
    DROP CONSTRAINT pipeline_runs_callback_url_valid,
    DROP CONSTRAINT pipeline_runs_metadata_object,
    DROP CONSTRAINT pipeline_runs_metadata_size,
    DROP CONSTRAINT pipeline_runs_attempt_valid,
    DROP CONSTRAINT pipeline_runs_time_range,
    ADD CONSTRAINT pipeline_runs_time_range CHECK (
        least(created_at, updated_at, run_after, lease_expires_at) >= '0001-01-01 00:00:00+00'
        AND greatest(created_at, updated_at, run_after, lease_expires_at) <= '9999-12-31 00:00:00+00') NOT VALID;

ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_time_range;
