-- A request's metadata (the client's own JSON object), for the status API.
SELECT metadata
FROM pipeline_runs
WHERE id = $1
