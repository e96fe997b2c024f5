-- Every tenant, by name (whether a callback secret is set, never the secret).
SELECT id, name, requests_per_minute, max_in_flight, callback_secret IS NOT NULL AS has_callback_secret, created_at
FROM tenants
ORDER BY name
