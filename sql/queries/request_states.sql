-- What the HTTP API shows of requests: status, answer and error.
SELECT id, user_id, status, final_answer, error, question
FROM pipeline_runs
WHERE id = ANY($1::uuid[])
