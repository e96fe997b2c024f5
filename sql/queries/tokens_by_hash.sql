-- The live (not revoked) token whose SHA-256 is $1, with its tenant; stamps
-- last_used_at (the HTTP server caches a found token for a few seconds, so
-- this runs about once per token per cache period, not per request).
UPDATE api_tokens t
SET last_used_at = now()
FROM tenants n
WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL AND n.id = t.tenant_id
RETURNING t.id, t.name, t.scope, t.token_sha256, t.tenant_id, n.name AS tenant_name,
          n.requests_per_minute, n.max_in_flight, t.operator
