-- Renews the leases still held under the given tokens; returns those renewed.
-- A lease that is not returned was lost (expired and taken back, cancelled).
UPDATE pipeline_runs r
SET lease_expires_at = now() + make_interval(secs => $3)
FROM unnest($1::uuid[], $2::int8[]) AS t(id, token)
WHERE r.id = t.id AND r.lease_token = t.token AND r.lease_expires_at IS NOT NULL
RETURNING r.id
