-- Deletes up to $2 idempotency keys of user $1 (those of deleted requests
-- are gone already; this catches any other).
WITH gone AS (
    DELETE FROM http_idempotency_keys WHERE (user_id, key) IN (
        SELECT user_id, key FROM http_idempotency_keys WHERE user_id = $1 LIMIT $2)
    RETURNING key
)
SELECT count(*) AS deleted FROM gone
