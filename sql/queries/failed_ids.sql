-- Every FAILED run, oldest failure first (the set `retry --all-failed` works through).
SELECT id FROM pipeline_runs WHERE status = 'FAILED' ORDER BY updated_at, id
