-- Deletes up to $2 turns of user $1 (raw_logs_user_seq_idx).
WITH gone AS (
    DELETE FROM raw_logs WHERE id IN (
        SELECT id FROM raw_logs WHERE user_id = $1 ORDER BY user_seq LIMIT $2)
    RETURNING id
)
SELECT count(*) AS deleted FROM gone
