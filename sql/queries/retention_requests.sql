-- Retention: deletes up to $2 terminal requests that finished more than $1
-- seconds ago (their steps, callbacks and operator actions go with them by
-- ON DELETE CASCADE); returns how many. SKIP LOCKED, so several daemons may
-- run it at once. raw_logs and lsm_storage are memory, not history: kept.
WITH doomed AS (
    SELECT id
    FROM pipeline_runs
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')
      AND updated_at < now() - make_interval(secs => $1::float8)
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM pipeline_runs r USING doomed d WHERE r.id = d.id RETURNING 1
)
SELECT count(*)::int8 AS deleted FROM gone
