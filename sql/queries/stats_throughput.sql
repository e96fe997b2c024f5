-- The operator console's overview chart: requests finished in the last
-- hour, by terminal status, in $1 buckets of $2 seconds, bucket 0 the
-- oldest. Reads pipeline_runs_finished_idx (terminal rows by updated_at):
-- the last hour's entries only, whatever the table's size.
-- $1 buckets
-- $2 bucket width in seconds
SELECT b.bucket,
       count(*) FILTER (WHERE r.status = 'COMPLETED')::int8 AS completed,
       count(*) FILTER (WHERE r.status = 'FAILED')::int8 AS failed,
       count(*) FILTER (WHERE r.status = 'CANCELLED')::int8 AS cancelled
FROM pipeline_runs r
CROSS JOIN LATERAL (
    SELECT ($1::int - 1 - floor(extract(epoch FROM now() - r.updated_at) / $2::float8))::int AS bucket
) b
WHERE r.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
  AND r.updated_at >= now() - make_interval(secs => $1::int * $2::float8)
  AND b.bucket >= 0
GROUP BY b.bucket
ORDER BY b.bucket
