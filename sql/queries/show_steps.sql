SELECT stage, attempt, worker, started_at, finished_at, outcome, error_class, error_message,
       model, prompt_tokens, completion_tokens, latency_ms
FROM pipeline_steps
WHERE run_id = $1
ORDER BY id
