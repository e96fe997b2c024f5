-- The first request of an idempotency key and its fingerprint; the key
-- belongs to the stored user maas_tenant_user($3, $1).
SELECT request_id, fingerprint
FROM http_idempotency_keys
WHERE user_id = maas_tenant_user($3, $1) AND key = $2
