-- embed_pending.sql among the users of the turns logged after raw_logs id
-- $3 only: the embedder's pass while it keeps up (src/embedder.rs). The
-- new turns are found through raw_logs_pkey and their users' marks through
-- archive_marks' key, so an idle pass reads what is new, not every user.
-- $1 model
-- $2 most users
-- $3 raw_logs id: turns after it
SELECT m.user_id,
       CASE WHEN m.embedded_model IS DISTINCT FROM $1::text THEN 0 ELSE m.embedded_seq END AS embedded_seq,
       m.logged_seq
FROM (SELECT DISTINCT r.user_id FROM raw_logs r WHERE r.id > $3::bigint) u
JOIN archive_marks m ON m.user_id = u.user_id
WHERE m.logged_seq > m.embedded_seq OR m.embedded_model IS DISTINCT FROM $1::text
LIMIT $2
