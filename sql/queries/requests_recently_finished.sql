-- The operator console's overview: the most recently finished requests.
-- Matches the partial pipeline_runs_finished_idx (terminal rows by
-- updated_at), so it reads $1 index entries whatever the table's size.
SELECT id, status, user_id, updated_at, error, left(user_query, 80) AS query
FROM pipeline_runs
WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')
ORDER BY updated_at DESC
LIMIT $1
