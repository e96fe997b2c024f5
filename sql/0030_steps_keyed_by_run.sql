-- One index less on the step history: every request writes three step
-- rows, and each took an entry in the primary key (id) and in
-- pipeline_steps_run_idx (run_id, id). No statement looks a step up by its
-- id alone: every reader asks for a run's steps in order (the console, the
-- CLI, the export, `retry_failed.sql`'s last step) or scans by time (the
-- BRIN on finished_at). The primary key is now (run_id, id), which serves
-- those readers as the run index did and keeps a step's identity (id is
-- still an identity column, unique on its own), so each step row takes one
-- B-tree entry instead of two (`bin/bench --only=writes`, BENCHMARKS.md).
--
-- Built inside the migration's transaction (writes to the table wait for
-- it): on a large table, build the unique index beforehand with
-- CREATE UNIQUE INDEX CONCURRENTLY pipeline_steps_run_key ON pipeline_steps
-- (run_id, id); this migration then only swaps the key.

CREATE UNIQUE INDEX IF NOT EXISTS pipeline_steps_run_key ON pipeline_steps (run_id, id);
ALTER TABLE pipeline_steps
    DROP CONSTRAINT pipeline_steps_pkey,
    ADD CONSTRAINT pipeline_steps_pkey PRIMARY KEY USING INDEX pipeline_steps_run_key;
DROP INDEX IF EXISTS pipeline_steps_run_idx;
