-- Adds tenant $1 with limits $2 (requests per minute) and $3 (in flight)
-- and callback secret $4, on behalf of $5, and records the action (never
-- the secret).
WITH made AS (
    INSERT INTO tenants (name, requests_per_minute, max_in_flight, callback_secret)
    VALUES ($1, $2, $3, $4)
    RETURNING id, name, requests_per_minute, max_in_flight, callback_secret IS NOT NULL AS has_callback_secret,
              created_at
),
audit AS (
    INSERT INTO operator_actions (action, actor, detail)
    SELECT 'tenant_add', $5::text,
           jsonb_build_object('tenant', name, 'requests_per_minute', requests_per_minute,
                              'max_in_flight', max_in_flight, 'callback_secret', has_callback_secret)
    FROM made
)
SELECT * FROM made
