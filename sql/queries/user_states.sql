-- The requests of user $1 that a live subscriber should see: those not yet
-- terminal, and (when $2 is given) those changed since $2. Newest first, at
-- most $3.
SELECT id, user_id, status, final_answer, error, question
FROM pipeline_runs
WHERE user_id = $1
  AND (status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') OR ($2::timestamptz IS NOT NULL AND updated_at >= $2))
ORDER BY created_at DESC
LIMIT $3
