-- In-flight leases by daemon: how many, how many already expired (the sweep
-- will take them back), and the earliest expiry.
SELECT lease_owner, count(*)::int8, count(*) FILTER (WHERE lease_expires_at < now())::int8, min(lease_expires_at)
FROM pipeline_runs
WHERE lease_expires_at IS NOT NULL
GROUP BY lease_owner
ORDER BY 2 DESC, 1
