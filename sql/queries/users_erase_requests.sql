-- Deletes up to $2 requests of user $1, in flight or not: their steps
-- (trigger), idempotency keys, callback deliveries and operator actions
-- go with them. A stage still running for one of them loses its lease
-- (the heartbeat finds no row) and its result matches no row (fencing).
-- Waits for the row locks of a finishing stage (short), holds its own
-- only for the batch.
WITH victims AS (
    SELECT id FROM pipeline_runs WHERE user_id = $1 LIMIT $2 FOR UPDATE
),
gone AS (
    DELETE FROM pipeline_runs r USING victims v WHERE r.id = v.id RETURNING r.id
)
SELECT count(*) AS deleted FROM gone
