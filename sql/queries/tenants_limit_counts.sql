-- A limited tenant's usage, counted only as far as its limits need: the
-- submissions of the last minute with the turns it stored outside a
-- request (tenant_turns: MCP `remember`), at most $2, the
-- requests_per_minute (none counted when NULL); the whole seconds until
-- the oldest of them leaves the minute (at least 1); and the requests not
-- yet terminal (at most $3, the max_in_flight; none counted when NULL).
-- The default tenant's rows are not in the indexes these read
-- (sql/0012_tenants.sql; the literal lets a generic plan use them), and it
-- writes no tenant_turns.
WITH recent AS (
    (SELECT created_at FROM pipeline_runs
     WHERE $2::int IS NOT NULL
       AND tenant_id = $1 AND tenant_id <> '00000000-0000-0000-0000-000000000000'
       AND created_at > now() - interval '1 minute'
     ORDER BY created_at
     LIMIT $2)
    UNION ALL
    (SELECT created_at FROM tenant_turns
     WHERE $2::int IS NOT NULL
       AND tenant_id = $1
       AND created_at > now() - interval '1 minute'
     ORDER BY created_at
     LIMIT $2)
)
SELECT
    (SELECT least(count(*), $2::int8) FROM recent) AS last_minute,
    (SELECT greatest(1, ceil(coalesce(extract(epoch FROM (min(created_at) + interval '1 minute' - now())), 1)))::int8
     FROM recent) AS window_frees_in,
    (SELECT count(*) FROM (
        SELECT 1 FROM pipeline_runs
        WHERE $3::int IS NOT NULL
          AND tenant_id = $1 AND tenant_id <> '00000000-0000-0000-0000-000000000000'
          AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
        LIMIT $3) f) AS in_flight
