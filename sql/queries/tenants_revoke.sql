-- Removes database role $1's mapping to a tenant on behalf of $2 and records
-- the action. From then on the role inserts for, and reads through
-- maas_my_requests, the tenant of another mapping that covers it (of a role
-- it is a member of, sql/0035_no_trust_in_the_caller.sql), or nothing: a
-- role no mapping covers is refused (triggers/0006_assign_tenant.sql) and
-- reads no rows. So the mapping goes whatever grants the role still holds;
-- the row says which it still holds, and which mappings still cover it. A
-- dropped role's mapping is removed too (a new role of the same name would
-- otherwise inherit it).
-- $1 role
-- $2 actor
WITH asked AS (
    SELECT m.role, t.name AS tenant, r.oid AS role_oid,
           r.oid IS NOT NULL AND (has_table_privilege(r.oid, 'pipeline_runs', 'INSERT')
                                  OR has_table_privilege(r.oid, 'raw_logs', 'INSERT')
                                  OR has_table_privilege(r.oid, 'maas_my_requests', 'SELECT')) AS still_producing
    FROM (SELECT) one
    LEFT JOIN tenant_roles m ON m.role = $1::text::name
    LEFT JOIN tenants t ON t.id = m.tenant_id
    LEFT JOIN pg_roles r ON r.rolname = $1::text::name
),
revoked AS (
    DELETE FROM tenant_roles m
    USING asked a
    WHERE m.role = a.role
    RETURNING m.role
),
audit AS (
    INSERT INTO operator_actions (action, actor, detail)
    SELECT 'tenant_revoke', $2::text, jsonb_build_object('tenant', a.tenant, 'role', a.role::text)
    FROM asked a, revoked
)
SELECT a.tenant, a.still_producing, EXISTS (SELECT FROM revoked) AS revoked,
       ARRAY(SELECT t.name || ' (role ' || m.role::text || ')'
             FROM tenant_roles m
             JOIN pg_roles g ON g.rolname = m.role
             JOIN tenants t ON t.id = m.tenant_id
             WHERE m.role <> $1::text::name AND pg_has_role(a.role_oid, g.oid, 'USAGE')
             ORDER BY t.name, m.role) AS still_covered_by
FROM asked a
