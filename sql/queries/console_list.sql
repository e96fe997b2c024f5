-- The operator console's request list, newest first, paged by keyset on
-- (created_at, id): a page starts strictly after the last row of the one
-- before, never at an OFFSET. NULL filters mean any.
-- Indexes: a user filter uses pipeline_runs_user_idx (0.4 ms at 1M rows).
-- The others need (a migration to come; not in this branch, whose number
-- must follow the ones merged before it):
--   CREATE INDEX pipeline_runs_created_idx ON pipeline_runs (created_at DESC, id DESC);
--   CREATE INDEX pipeline_runs_status_created_idx ON pipeline_runs (status, created_at DESC, id DESC);
-- measured at 1M rows: no filter 296 → 0.08 ms, status 116 → 0.10 ms. The
-- text filter scans (214 ms at 1M rows) until a pg_trgm index exists.
-- $1 statuses
-- $2 user_id
-- $3 thread_id
-- $4 text
-- $5 before_created
-- $6 before_id
-- $7 limit
SELECT id, status, user_id, thread_id, attempt, debug, held, created_at, updated_at, error,
       left(user_query, 120) AS query
FROM pipeline_runs
WHERE ($1::text[] IS NULL OR status = ANY($1::text[]))
  AND ($2::uuid IS NULL OR user_id = $2::uuid)
  AND ($3::uuid IS NULL OR thread_id = $3::uuid)
  AND ($4::text IS NULL OR strpos(lower(user_query), lower($4::text)) > 0)
  AND ($5::timestamptz IS NULL OR (created_at, id) < ($5::timestamptz, $6::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $7
