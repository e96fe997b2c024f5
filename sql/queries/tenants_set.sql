-- Changes tenant $1 (name) on behalf of $8 and records the action: when
-- $2, requests_per_minute := $3; when $4, max_in_flight := $5; when $6,
-- callback_secret := $7 (NULL clears each). No row: unknown tenant.
WITH changed AS (
    UPDATE tenants
    SET requests_per_minute = CASE WHEN $2 THEN $3::int ELSE requests_per_minute END,
        max_in_flight       = CASE WHEN $4 THEN $5::int ELSE max_in_flight END,
        callback_secret     = CASE WHEN $6 THEN $7::text ELSE callback_secret END
    WHERE name = $1
    RETURNING id, name, requests_per_minute, max_in_flight, callback_secret IS NOT NULL AS has_callback_secret,
              created_at
),
audit AS (
    INSERT INTO operator_actions (action, actor, detail)
    SELECT 'tenant_set', $8::text,
           jsonb_build_object('tenant', name, 'requests_per_minute', requests_per_minute,
                              'max_in_flight', max_in_flight, 'callback_secret', has_callback_secret,
                              'secret_changed', $6::bool)
    FROM changed
)
SELECT * FROM changed
