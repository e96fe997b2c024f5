-- Removes database role $1's mapping to a tenant on behalf of $2 and records
-- the action. A role mapped to no tenant inserts for the default tenant and
-- reads the default tenant's requests through maas_my_requests, so nothing
-- is removed while the role exists and still holds INSERT on pipeline_runs
-- or raw_logs or SELECT on maas_my_requests: those are revoked, or the role
-- dropped, first. A dropped role's mapping is removed (a new role of the
-- same name would otherwise inherit it). The one row says what was found
-- and done.
-- $1 role
-- $2 actor
WITH asked AS (
    SELECT m.role, t.name AS tenant,
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
    WHERE m.role = a.role AND NOT a.still_producing
    RETURNING m.role
),
audit AS (
    INSERT INTO operator_actions (action, actor, detail)
    SELECT 'tenant_revoke', $2::text, jsonb_build_object('tenant', a.tenant, 'role', a.role::text)
    FROM asked a, revoked
)
SELECT a.tenant, a.still_producing, EXISTS (SELECT FROM revoked) AS revoked
FROM asked a
