-- Every database role mapped to a tenant (tenant_roles,
-- sql/0020_tenant_roles.sql), by tenant and role.
SELECT t.name AS tenant, m.role::text AS role, m.created_at
FROM tenant_roles m
JOIN tenants t ON t.id = m.tenant_id
ORDER BY t.name, m.role
