-- The operator console's overview chart: p50 and p99 of the stage
-- attempts' latency in the last hour, by stage, in $1 buckets of $2
-- seconds, bucket 0 the oldest. Reads pipeline_steps_finished_brin: the
-- block ranges of the last hour only.
-- $1 buckets
-- $2 bucket width in seconds
SELECT s.stage, b.bucket,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s.latency_ms)::float8 AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY s.latency_ms)::float8 AS p99,
       count(*)::int8 AS n
FROM pipeline_steps s
CROSS JOIN LATERAL (
    SELECT ($1::int - 1 - floor(extract(epoch FROM now() - s.finished_at) / $2::float8))::int AS bucket
) b
WHERE s.finished_at >= now() - make_interval(secs => $1::int * $2::float8)
  AND s.latency_ms IS NOT NULL
  AND b.bucket >= 0
GROUP BY s.stage, b.bucket
ORDER BY s.stage, b.bucket
