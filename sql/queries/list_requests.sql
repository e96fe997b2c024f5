-- Requests for `maasctl requests list`, most recently changed first. Filters are
-- optional (NULL = any): statuses $1, user $2, unchanged for more than $3
-- seconds; at most $4 rows.
SELECT id, status, user_id, attempt, debug, held, callback_url IS NOT NULL AS has_callback,
       created_at, updated_at, run_after, lease_owner, error, left(user_query, 120) AS query
FROM pipeline_runs
WHERE ($1::text[] IS NULL OR status = ANY($1::text[]))
  AND ($2::uuid IS NULL OR user_id = $2::uuid)
  AND ($3::float8 IS NULL OR updated_at < now() - make_interval(secs => $3::float8))
ORDER BY updated_at DESC, id
LIMIT $4
