-- A page of user $1's turns for the export, in the user's order, after
-- user_seq $2 (raw_logs_user_seq_idx); $3 rows at most.
SELECT id, user_seq, request_id, thread_id, message_type, content, created_at
FROM raw_logs
WHERE user_id = $1 AND user_seq > $2
ORDER BY user_seq
LIMIT $3
