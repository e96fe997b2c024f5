-- User $1's most recent threads, newest first, at most $2: the turns each
-- has among the user's newest 2000, when it started and last changed, and
-- its newest turn. Reads the newest turns by raw_logs_user_idx only.
-- $1 user_id
-- $2 limit
WITH recent AS (
    SELECT id, thread_id, content, created_at
    FROM raw_logs
    WHERE user_id = $1 AND thread_id IS NOT NULL
    ORDER BY id DESC
    LIMIT 2000
)
SELECT thread_id, count(*) AS turns, min(created_at) AS started_at, max(created_at) AS last_at,
       (array_agg(content ORDER BY id DESC))[1] AS last_turn
FROM recent
GROUP BY thread_id
ORDER BY max(id) DESC
LIMIT $2
