-- Parameters, in the order `FailedParams` (src/repo/callbacks.rs) binds them (a unit test
-- compares the two lists):
-- $1  id
-- $2  attempt
-- $3  last_status
-- $4  last_error
-- $5  retry_secs
-- $6  state  (`dead`, or `pending` to be retried)
--
-- Records a failed attempt $2 of delivery $1 (HTTP status $3, error $4):
-- pending again, retried after $5 seconds, or dead, as $6 says. Fenced on the attempt,
-- so a worker whose lease ran out and was overtaken changes nothing.
UPDATE callback_outbox
SET state = $6::text,
    next_attempt_at = now() + make_interval(secs => $5::float8),
    last_status = $3,
    last_error = $4
WHERE id = $1 AND attempts = $2 AND state = 'pending'
