-- The stored user id of tenant $1's user $2 (maas_tenant_user,
-- sql/0012_tenants.sql): the same id for the default tenant, a version-8
-- UUID of its own for any other.
-- $1 tenant_id
-- $2 user_id
SELECT maas_tenant_user($1, $2) AS user_id
