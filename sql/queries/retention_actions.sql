-- Retention of operator actions that belong to no run (pause, resume,
-- prompt changes): up to $2 older than $1 seconds; returns how many.
WITH doomed AS (
    SELECT id FROM operator_actions
    WHERE run_id IS NULL AND at < now() - make_interval(secs => $1::float8)
    ORDER BY at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM operator_actions a USING doomed d WHERE a.id = d.id RETURNING 1
)
SELECT count(*)::int8 AS deleted FROM gone
