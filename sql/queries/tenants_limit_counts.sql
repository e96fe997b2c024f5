-- A limited tenant's usage (never the default tenant's: its rows are not in
-- the indexes, sql/0012_tenants.sql; the literal lets a generic plan use
-- them): submissions in the last minute, the seconds until the oldest of
-- them leaves the minute (at least 1), and the requests not yet terminal.
SELECT count(*) AS last_minute,
       greatest(1, ceil(coalesce(extract(epoch FROM (min(created_at) + interval '1 minute' - now())), 1)))::int8
           AS window_frees_in,
       (SELECT count(*) FROM pipeline_runs
        WHERE tenant_id = $1 AND tenant_id <> '00000000-0000-0000-0000-000000000000'
          AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')) AS in_flight
FROM pipeline_runs
WHERE tenant_id = $1 AND tenant_id <> '00000000-0000-0000-0000-000000000000'
  AND created_at > now() - interval '1 minute'
