-- Tokens (never their hash), newest first; revoked ones only when $1.
SELECT t.id, t.name, n.name AS tenant, t.scope, t.operator, t.user_id, t.created_at, t.last_used_at, t.revoked_at
FROM api_tokens t JOIN tenants n ON n.id = t.tenant_id
WHERE $1 OR t.revoked_at IS NULL
ORDER BY t.id DESC
