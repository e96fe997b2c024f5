-- The producer roles, for `maasctl doctor`: every role (but PostgreSQL's
-- own pg_* roles) that may INSERT into pipeline_runs or raw_logs and may
-- not UPDATE pipeline_runs, and every role a mapping covers (the mapped
-- roles and their members with INHERIT). For each: the tenants whose
-- mappings cover it (none, or two or more: its inserts are refused), the
-- schemas it may CREATE in (a role sets its own search_path, so any of
-- them may be on it; maas's own schema, `current_schema()`, would let it
-- shadow what maas runs) and whether it may create TEMP tables here.
WITH mapped AS (
    SELECT t.name AS tenant, g.oid AS role_oid
    FROM tenant_roles m
    JOIN tenants t ON t.id = m.tenant_id
    JOIN pg_roles g ON g.rolname = m.role
),
producers AS (
    SELECT r.oid, r.rolname
    FROM pg_roles r
    WHERE r.rolname !~ '^pg_'
      AND NOT has_table_privilege(r.oid, 'pipeline_runs', 'UPDATE')
      AND (has_table_privilege(r.oid, 'pipeline_runs', 'INSERT')
           OR has_table_privilege(r.oid, 'raw_logs', 'INSERT')
           OR EXISTS (SELECT FROM mapped p WHERE pg_has_role(r.oid, p.role_oid, 'USAGE')))
)
SELECT p.rolname::text AS role,
       ARRAY(SELECT DISTINCT mp.tenant FROM mapped mp
             WHERE pg_has_role(p.oid, mp.role_oid, 'USAGE') ORDER BY 1) AS tenants,
       ARRAY(SELECT n.nspname::text FROM pg_namespace n
             WHERE has_schema_privilege(p.oid, n.oid, 'CREATE') ORDER BY 1) AS creates_in,
       has_database_privilege(p.oid, current_database(), 'TEMP') AS temp,
       current_schema()::text AS maas_schema
FROM producers p
ORDER BY p.rolname
