-- Callback deliveries not yet delivered: pending (with the oldest one's age
-- in seconds) and dead (attempts exhausted).
SELECT count(*) FILTER (WHERE state = 'pending')::int8,
       count(*) FILTER (WHERE state = 'dead')::int8,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending'))::float8
FROM callback_outbox
WHERE state IN ('pending', 'dead')
