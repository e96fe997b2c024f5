-- The first request of an idempotency key and its fingerprint.
SELECT request_id, fingerprint
FROM http_idempotency_keys
WHERE user_id = $1 AND key = $2
