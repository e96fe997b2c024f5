-- Bounds on every column a producer may write (invariant 9: one bad row
-- harms nobody else). A value outside them is refused at INSERT with the
-- constraint's name; every value inside them is one the engine's
-- statements process without an error: counters the claim bumps saturate
-- at their bound (claim.sql, finish.sql), times stay within the years both
-- PostgreSQL and the daemon's clock types can compute with (1..9999, so
-- `now() - t` and reading `t` never overflow), texts stay within the sizes
-- the engine itself can write (answers and contexts from a model are capped
-- before they are written, src/stage/sanitize.rs).
--
-- Existing rows are brought inside the bounds first, so migrating a
-- database that already holds odd rows cannot fail: an active request with
-- an out-of-bounds value is FAILED with a reason naming the column; a
-- finished one keeps its status with the value clamped. Each constraint is
-- then added NOT VALID (no scan under the strong lock) and validated.

-- pipeline_runs -----------------------------------------------------------

-- Active requests with a value no statement should have to process: FAILED,
-- with the reason.
UPDATE pipeline_runs
SET status = 'FAILED',
    error = 'refused by migration 0009: ' || concat_ws(', ',
        CASE WHEN attempt > 1000 THEN 'attempt ' || attempt || ' is over 1000' END,
        CASE WHEN lease_token > 4611686018427387904 OR lease_token < 0 THEN 'lease_token is out of range' END,
        CASE WHEN NOT (run_after BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
             THEN 'run_after is out of range' END,
        CASE WHEN analysis_result IS NOT NULL AND jsonb_typeof(analysis_result) <> 'object'
             THEN 'analysis_result is not a JSON object' END),
    lease_owner = NULL,
    lease_expires_at = NULL,
    held = false
WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
  AND (attempt > 1000
       OR lease_token > 4611686018427387904 OR lease_token < 0
       OR NOT (run_after BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
       OR (analysis_result IS NOT NULL AND jsonb_typeof(analysis_result) <> 'object'));

-- Every row: values clamped into the bounds.
UPDATE pipeline_runs
SET attempt = least(attempt, 1000),
    lease_token = least(greatest(lease_token, 0), 4611686018427387904),
    run_after = CASE WHEN run_after BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                     THEN run_after ELSE now() END,
    created_at = CASE WHEN created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                      THEN created_at ELSE now() END,
    updated_at = CASE WHEN updated_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                      THEN updated_at ELSE now() END,
    lease_expires_at = CASE WHEN lease_expires_at IS NULL
                                 OR lease_expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                            THEN lease_expires_at ELSE now() END,
    lease_owner = left(lease_owner, 256),
    error = left(error, 100000),
    final_answer = left(final_answer, 1000000),
    final_context_payload = left(final_context_payload, 4000000),
    analysis_result = CASE WHEN analysis_result IS NULL OR jsonb_typeof(analysis_result) <> 'object'
                                OR octet_length(analysis_result::text) > 1000000
                           THEN NULL ELSE analysis_result END
WHERE attempt > 1000
   OR lease_token > 4611686018427387904 OR lease_token < 0
   OR NOT (run_after BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR NOT (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR NOT (updated_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR NOT (lease_expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR length(lease_owner) > 256
   OR length(error) > 100000
   OR length(final_answer) > 1000000
   OR length(final_context_payload) > 4000000
   OR jsonb_typeof(analysis_result) <> 'object'
   OR octet_length(analysis_result::text) > 1000000;

-- The claim counts an attempt with `least(attempt + 1, 1000)`: a request at
-- the bound is still claimed and run, and FAILED by the attempt policy if
-- its stage fails.
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_attempt_range
    CHECK (attempt BETWEEN 0 AND 1000) NOT VALID;
-- The claim bumps the token with `least(…, 2^62)`, never past bigint.
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_lease_token_range
    CHECK (lease_token BETWEEN 0 AND 4611686018427387904) NOT VALID;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_time_range CHECK (
    created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
    AND updated_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
    AND run_after BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
    AND (lease_expires_at IS NULL
         OR lease_expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')) NOT VALID;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_lease_owner_size
    CHECK (length(lease_owner) <= 256) NOT VALID;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_error_size
    CHECK (length(error) <= 100000) NOT VALID;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_answer_size
    CHECK (length(final_answer) <= 1000000) NOT VALID;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_context_size
    CHECK (length(final_context_payload) <= 4000000) NOT VALID;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_analysis_shape
    CHECK (jsonb_typeof(analysis_result) = 'object' AND octet_length(analysis_result::text) <= 1000000) NOT VALID;

ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_attempt_range;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_lease_token_range;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_time_range;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_lease_owner_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_error_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_answer_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_context_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_analysis_shape;

-- raw_logs ------------------------------------------------------------------

UPDATE raw_logs
SET created_at = CASE WHEN created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                      THEN created_at ELSE now() END,
    content = left(content, 1000000)
WHERE NOT (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR length(content) > 1000000;

ALTER TABLE raw_logs ADD CONSTRAINT raw_logs_time_range
    CHECK (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00') NOT VALID;
ALTER TABLE raw_logs ADD CONSTRAINT raw_logs_content_size
    CHECK (length(content) <= 1000000) NOT VALID;
ALTER TABLE raw_logs VALIDATE CONSTRAINT raw_logs_time_range;
ALTER TABLE raw_logs VALIDATE CONSTRAINT raw_logs_content_size;

-- lsm_storage ---------------------------------------------------------------

UPDATE lsm_storage
SET time_bucket_start = CASE WHEN time_bucket_start BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                             THEN time_bucket_start ELSE now() END,
    time_bucket_end = CASE WHEN time_bucket_end BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                           THEN time_bucket_end ELSE now() END,
    created_at = CASE WHEN created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
                      THEN created_at ELSE now() END,
    summary = left(summary, 1000000),
    tags = tags[1:1000]
WHERE NOT (time_bucket_start BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR NOT (time_bucket_end BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR NOT (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')
   OR length(summary) > 1000000
   OR cardinality(tags) > 1000;
-- A bucket clamped on one side only may now end before it starts.
UPDATE lsm_storage SET time_bucket_start = time_bucket_end WHERE time_bucket_start > time_bucket_end;

ALTER TABLE lsm_storage ADD CONSTRAINT lsm_storage_time_range CHECK (
    time_bucket_start BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
    AND time_bucket_end BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'
    AND created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00') NOT VALID;
ALTER TABLE lsm_storage ADD CONSTRAINT lsm_storage_summary_size
    CHECK (length(summary) <= 1000000) NOT VALID;
ALTER TABLE lsm_storage ADD CONSTRAINT lsm_storage_tags_size
    CHECK (cardinality(tags) <= 1000) NOT VALID;
ALTER TABLE lsm_storage VALIDATE CONSTRAINT lsm_storage_time_range;
ALTER TABLE lsm_storage VALIDATE CONSTRAINT lsm_storage_summary_size;
ALTER TABLE lsm_storage VALIDATE CONSTRAINT lsm_storage_tags_size;
