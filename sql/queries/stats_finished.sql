-- Runs that finished in the last $1 seconds, by terminal status.
SELECT status, count(*)::int8 AS n
FROM pipeline_runs
WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED') AND updated_at >= now() - make_interval(secs => $1::float8)
GROUP BY status
