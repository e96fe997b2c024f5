-- Tenant $1's limits, its row locked until the transaction ends: the
-- submissions of one tenant are then counted (tenants_limit_counts) and
-- inserted one after the other, from any number of daemons. No row: no
-- such tenant.
-- $1 tenant_id
SELECT requests_per_minute, max_in_flight
FROM tenants
WHERE id = $1
FOR UPDATE
