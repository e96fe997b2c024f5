-- The next turns of user $1 to embed, after user_seq $2, oldest first, each
-- with the text of the turns on either side of it in its thread
-- (raw_logs_thread_idx): a turn is embedded together with them. The turn
-- before the first new turn of each thread was embedded without its next
-- one; it comes again (`again`) to be embedded with it.
-- $1 user_id
-- $2 after (user_seq)
-- $3 most turns
WITH fresh AS (
    SELECT r.id, r.user_id, r.thread_id, r.user_seq, r.content
    FROM raw_logs r
    WHERE r.user_id = $1::uuid AND r.user_seq > $2::bigint
    ORDER BY r.user_seq
    LIMIT $3
), again AS (
    SELECT DISTINCT ON (b.id) b.id, b.user_id, b.thread_id, b.user_seq, b.content
    FROM fresh f
    CROSS JOIN LATERAL (
        SELECT b.id, b.user_id, b.thread_id, b.user_seq, b.content FROM raw_logs b
        WHERE b.user_id = f.user_id AND b.thread_id = f.thread_id AND b.user_seq < f.user_seq
        ORDER BY b.user_seq DESC
        LIMIT 1) b
    WHERE b.user_seq <= $2::bigint
), t AS (
    SELECT *, false AS again FROM fresh
    UNION ALL
    SELECT *, true FROM again
)
SELECT t.id, t.user_seq, t.again, t.content, p.content AS previous, n.content AS next
FROM t
LEFT JOIN LATERAL (
    SELECT b.content FROM raw_logs b
    WHERE b.user_id = t.user_id AND b.thread_id = t.thread_id AND b.user_seq < t.user_seq
    ORDER BY b.user_seq DESC
    LIMIT 1) p ON true
LEFT JOIN LATERAL (
    SELECT a.content FROM raw_logs a
    WHERE a.user_id = t.user_id AND a.thread_id = t.thread_id AND a.user_seq > t.user_seq
    ORDER BY a.user_seq
    LIMIT 1) n ON true
ORDER BY t.user_seq
