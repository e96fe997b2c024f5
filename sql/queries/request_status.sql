-- The status of one request (no row: unknown id).
SELECT status FROM pipeline_runs WHERE id = $1
