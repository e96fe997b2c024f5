-- What the HTTP API shows of request $1 to tenant $2: no row when the
-- request is unknown or another tenant's.
SELECT id, user_id, status, final_answer, error, question
FROM pipeline_runs
WHERE id = $1 AND tenant_id = $2
