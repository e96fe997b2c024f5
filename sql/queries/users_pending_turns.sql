-- A page of user $1's turns not archived yet, newest first, by keyset on
-- user_seq (raw_logs_user_seq_idx).
-- $1 user_id
-- $2 before: only turns with a smaller user_seq (NULL: from the newest)
-- $3 limit
SELECT l.id, l.user_seq, l.request_id, l.thread_id, l.message_type, l.content, l.created_at
FROM raw_logs l
JOIN archive_marks m ON m.user_id = l.user_id
WHERE l.user_id = $1 AND l.user_seq > m.archived_seq AND ($2::bigint IS NULL OR l.user_seq < $2)
ORDER BY l.user_seq DESC
LIMIT $3
