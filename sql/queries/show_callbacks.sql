-- The callback deliveries of one run, oldest first.
SELECT id, event, url, state, attempts, next_attempt_at, last_status, last_error, delivered_at, created_at
FROM callback_outbox
WHERE run_id = $1
ORDER BY id
