-- maasd processes listening on this database (their LISTEN sessions), with
-- the client address and since when they are connected.
SELECT coalesce(host(client_addr), 'local') AS client, backend_start AS since
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'maasd-listener'
ORDER BY backend_start
