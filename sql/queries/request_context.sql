-- The assembled context of one request and the memory it holds (no row:
-- unknown id, or a request of another tenant than $2). For
-- `GET /api/query/{id}/status?include=context`.
SELECT final_context_payload, context_sources FROM pipeline_runs WHERE id = $1 AND tenant_id = $2
