-- Callback deliveries not yet delivered: pending (with the oldest one's age
-- in seconds) and dead (attempts exhausted).
SELECT count(*) FILTER (WHERE state = 'pending')::int8 AS pending,
       count(*) FILTER (WHERE state = 'dead')::int8 AS dead,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending'))::float8 AS oldest_pending_secs
FROM callback_outbox
WHERE state IN ('pending', 'dead')
