-- Maps database role $2 to tenant $1 (by name) on behalf of $3 and records
-- the action: the role's INSERTs into pipeline_runs and raw_logs are then
-- that tenant's (triggers/0006_assign_tenant.sql). A role mapped before is
-- moved (its earlier rows stay where they are). Nothing is mapped when the
-- tenant or the role is unknown, or when the role may UPDATE pipeline_runs:
-- such a role (maasd's runtime role, the owner, a superuser) is trusted to
-- name any tenant, so a mapping would promise what it does not hold. The
-- one row says which.
-- $1 tenant
-- $2 role
-- $3 actor
WITH asked AS (
    SELECT t.id AS tenant_id, t.name AS tenant, r.rolname AS role,
           r.oid IS NOT NULL AND has_table_privilege(r.oid, 'pipeline_runs', 'UPDATE') AS trusted,
           (SELECT m.tenant_id FROM tenant_roles m WHERE m.role = $2::text::name) AS previous
    FROM (SELECT) one
    LEFT JOIN tenants t ON t.name = $1
    LEFT JOIN pg_roles r ON r.rolname = $2::text::name
),
granted AS (
    INSERT INTO tenant_roles AS m (role, tenant_id)
    SELECT role, tenant_id FROM asked
    WHERE tenant_id IS NOT NULL AND role IS NOT NULL AND NOT trusted
    ON CONFLICT (role) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, created_at = now()
    RETURNING m.role
),
audit AS (
    INSERT INTO operator_actions (action, actor, detail)
    SELECT 'tenant_grant', $3::text,
           jsonb_build_object('tenant', a.tenant, 'role', a.role::text,
                              'previous_tenant', (SELECT name FROM tenants WHERE id = a.previous))
    FROM asked a, granted
)
SELECT a.tenant IS NOT NULL AS tenant_known,
       a.role IS NOT NULL AS role_known,
       a.trusted,
       EXISTS (SELECT FROM granted) AS granted
FROM asked a
