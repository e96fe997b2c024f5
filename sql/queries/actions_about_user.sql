-- The operator console's memory page: the newest operator actions about
-- user $1's memory (corrections, archive runs), through
-- operator_actions_user_idx.
-- $1 user_id
-- $2 limit
SELECT action, actor, reason, from_status, to_status, detail, at
FROM operator_actions
WHERE detail ? 'user_id' AND detail ->> 'user_id' = $1::uuid::text
ORDER BY id DESC
LIMIT $2
