-- Stores token $1 (name) of tenant $2 (name) with scope $3, SHA-256 $4 and
-- the operator flag $6 (the console sees every tenant) and the bound user $7
-- (the tenant's own user id; NULL: any user), on behalf of $5, and records
-- the action (never the token or its hash).
-- No row: unknown tenant.
WITH made AS (
    INSERT INTO api_tokens (name, tenant_id, scope, token_sha256, operator, user_id)
    SELECT $1, n.id, $3, $4, $6, $7::uuid FROM tenants n WHERE n.name = $2
    RETURNING id, name, scope, operator, user_id, created_at, last_used_at, revoked_at
),
audit AS (
    INSERT INTO operator_actions (action, actor, detail)
    SELECT 'token_create', $5::text, jsonb_build_object('token_id', id, 'name', name, 'tenant', $2::text, 'scope', scope,
                                                   'operator', operator, 'user_id', user_id)
    FROM made
)
SELECT id, name, $2::text AS tenant, scope, operator, user_id, created_at, last_used_at, revoked_at FROM made
