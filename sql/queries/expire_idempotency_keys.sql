-- Deletes up to $2 idempotency keys older than $1 seconds; daemons running
-- it at once skip each other's rows.
DELETE FROM http_idempotency_keys k
USING (
    SELECT user_id, key
    FROM http_idempotency_keys
    WHERE created_at < now() - make_interval(secs => $1)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) old
WHERE k.user_id = old.user_id AND k.key = old.key
