-- The live (not revoked) token with id $1, with its tenant and bound user (console sessions).
SELECT t.id, t.name, t.scope, t.token_sha256, t.tenant_id, n.name AS tenant_name,
       n.requests_per_minute, n.max_in_flight, t.operator, t.user_id
FROM api_tokens t JOIN tenants n ON n.id = t.tenant_id
WHERE t.id = $1 AND t.revoked_at IS NULL
