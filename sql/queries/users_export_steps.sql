-- The step history of the requests $2 (one export page) of user $1, by
-- request and in order. pipeline_steps_pkey (run_id, id).
SELECT s.run_id, s.stage, s.attempt, s.worker, s.started_at, s.finished_at, s.outcome,
       s.error_class, s.error_message, s.model, s.prompt_tokens, s.completion_tokens, s.latency_ms
FROM pipeline_steps s
JOIN pipeline_runs r ON r.id = s.run_id AND r.user_id = $1
WHERE s.run_id = ANY ($2::uuid[])
ORDER BY s.run_id, s.id
