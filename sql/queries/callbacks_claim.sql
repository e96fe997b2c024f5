-- Claims up to $1 due callback deliveries for one attempt each: counts the
-- attempt and pushes next_attempt_at $2 seconds ahead as a lease, so other
-- daemons skip them while this one delivers, and a crashed delivery is
-- retried once it passes. SKIP LOCKED: daemons never wait on each other.
-- `tenant_secret`: the request's tenant's callback_secret, which signs the
-- delivery instead of callbacks.secret when set (sql/0012_tenants.sql).
WITH due AS (
    SELECT id
    FROM callback_outbox
    WHERE state = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE callback_outbox o
SET attempts = o.attempts + 1,
    next_attempt_at = now() + make_interval(secs => $2::float8)
FROM due
WHERE o.id = due.id
RETURNING o.id, o.run_id, o.url, o.event, o.payload::text AS body, o.attempts,
          (SELECT t.callback_secret FROM pipeline_runs r JOIN tenants t ON t.id = r.tenant_id
           WHERE r.id = o.run_id) AS tenant_secret
