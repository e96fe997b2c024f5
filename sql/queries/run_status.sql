-- The status of one run (no row: unknown id).
SELECT status FROM pipeline_runs WHERE id = $1
