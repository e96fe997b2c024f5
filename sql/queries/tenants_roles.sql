-- Every database role mapped to a tenant (tenant_roles,
-- sql/0020_tenant_roles.sql), by tenant and role, with the login roles the
-- mapping covers (sql/0035_no_trust_in_the_caller.sql): the role itself if
-- it can log in and every login role that is a member of it with INHERIT
-- (pg_has_role … 'USAGE'), except trusted ones (a role that may UPDATE
-- pipeline_runs names its tenant itself). `refused`: those of them that a
-- mapping to another tenant covers too, so their inserts are refused.
-- `role_exists` is false for a mapping whose role was dropped.
SELECT t.name AS tenant, m.role::text AS role, m.created_at,
       g.oid IS NOT NULL AS role_exists,
       coalesce(c.covers, '{}') AS covers,
       coalesce(c.refused, '{}') AS refused
FROM tenant_roles m
JOIN tenants t ON t.id = m.tenant_id
LEFT JOIN pg_roles g ON g.rolname = m.role
LEFT JOIN LATERAL (
    SELECT array_agg(r.rolname::text ORDER BY r.rolname) AS covers,
           array_agg(r.rolname::text ORDER BY r.rolname) FILTER (
               WHERE EXISTS (SELECT FROM tenant_roles o
                             JOIN pg_roles og ON og.rolname = o.role
                             WHERE o.tenant_id <> m.tenant_id AND pg_has_role(r.oid, og.oid, 'USAGE'))) AS refused
    FROM pg_roles r
    WHERE r.rolcanlogin
      AND pg_has_role(r.oid, g.oid, 'USAGE')
      AND NOT has_table_privilege(r.oid, 'pipeline_runs', 'UPDATE')
) c ON true
ORDER BY t.name, m.role
