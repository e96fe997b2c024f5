-- In-flight leases by daemon: how many, how many already expired (the sweep
-- will take them back), and the earliest expiry.
SELECT lease_owner AS owner, count(*)::int8 AS held, count(*) FILTER (WHERE lease_expires_at < now())::int8 AS expired,
       min(lease_expires_at) AS earliest_expiry
FROM pipeline_runs
WHERE status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING')
GROUP BY lease_owner
ORDER BY 2 DESC, 1
