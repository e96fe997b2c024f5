-- Step history written by worker $2 after step $1 (at most $3 rows), for
-- the latency histograms of /metrics: stage duration (the measured latency,
-- else finish − start) and, for a request's last step, the time since it
-- was submitted.
SELECT s.id, s.stage, s.outcome,
       coalesce(s.latency_ms / 1000.0, extract(epoch FROM s.finished_at - s.started_at))::float8 AS stage_secs,
       extract(epoch FROM s.finished_at - r.created_at)::float8 AS request_secs
FROM pipeline_steps s
JOIN pipeline_runs r ON r.id = s.run_id
WHERE s.id > $1 AND s.worker = $2
ORDER BY s.id
LIMIT $3
