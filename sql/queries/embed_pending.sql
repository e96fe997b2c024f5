-- Users with turns the embedder has not embedded with model $1: new turns
-- past their mark, or all of them when the mark was made with another
-- model (the mark then counts from 0). A pass over archive_marks, which has
-- one row per user with memory; it runs only when embeddings are on.
-- $1 model
-- $2 most users
SELECT m.user_id,
       CASE WHEN m.embedded_model IS DISTINCT FROM $1::text THEN 0 ELSE m.embedded_seq END AS embedded_seq,
       m.logged_seq
FROM archive_marks m
WHERE m.logged_seq > m.embedded_seq OR m.embedded_model IS DISTINCT FROM $1::text
LIMIT $2
