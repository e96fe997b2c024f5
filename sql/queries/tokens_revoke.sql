-- Revokes the live token named $1 of tenant $2 (name) on behalf of $3 for
-- reason $4, and records the action. No row: no such live token.
WITH gone AS (
    UPDATE api_tokens t
    SET revoked_at = now()
    FROM tenants n
    WHERE n.name = $2 AND t.tenant_id = n.id AND t.name = $1 AND t.revoked_at IS NULL
    RETURNING t.id, t.name, n.name AS tenant, t.scope, t.operator, t.user_id, t.created_at, t.last_used_at, t.revoked_at
),
audit AS (
    INSERT INTO operator_actions (action, actor, reason, detail)
    SELECT 'token_revoke', $3::text, $4::text,
           jsonb_build_object('token_id', id, 'name', name, 'tenant', tenant, 'scope', scope)
    FROM gone
)
SELECT id, name, tenant, scope, operator, user_id, created_at, last_used_at, revoked_at FROM gone
