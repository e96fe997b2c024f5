-- Up to $4 pending logs of user $1 with $2 < user_seq <= $3, in sequence
-- order (the unique index on (user_id, user_seq)).
SELECT id, user_seq, thread_id, request_id, message_type, content, created_at
FROM raw_logs
WHERE user_id = $1 AND user_seq > $2 AND user_seq <= $3
ORDER BY user_seq
LIMIT $4
