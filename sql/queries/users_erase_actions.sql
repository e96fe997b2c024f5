-- Deletes up to $2 operator actions about user $1's memory (the forget
-- itself is recorded by the tombstone).
WITH gone AS (
    DELETE FROM operator_actions WHERE id IN (
        SELECT id FROM operator_actions
        WHERE detail ? 'user_id' AND detail ->> 'user_id' = $1::uuid::text
        LIMIT $2)
    RETURNING id
)
SELECT count(*) AS deleted FROM gone
