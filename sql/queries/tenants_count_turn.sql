-- Counts one turn tenant $1 stores outside a request (MCP `remember`)
-- against its requests_per_minute: drops its marks that left the minute
-- and adds one. Run under the lock of tenants_limit_lock, after the check.
-- $1 tenant_id
WITH gone AS (
    DELETE FROM tenant_turns
    WHERE tenant_id = $1 AND created_at <= now() - interval '1 minute'
)
INSERT INTO tenant_turns (tenant_id) VALUES ($1)
