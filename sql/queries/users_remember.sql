-- Stores what user $1 said as a turn of thread $2 (`user_query`), as a
-- producer's INSERT of the SQL interface would: the triggers number it
-- (user_seq) for the archivist and the embedder, and drop it when the user
-- was forgotten (no row then).
-- $1 user_id (stored)
-- $2 thread_id
-- $3 content
INSERT INTO raw_logs (user_id, thread_id, message_type, content)
VALUES ($1, $2, 'user_query', $3)
RETURNING id, thread_id, created_at
