-- Marks delivery $1 delivered with HTTP status $2 (even if its lease ran out
-- meanwhile: the receiver has it).
UPDATE callback_outbox
SET state = 'delivered', delivered_at = now(), last_status = $2, last_error = NULL
WHERE id = $1 AND state = 'pending'
