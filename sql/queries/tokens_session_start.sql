-- Starts console session $1 (a random id) of database token $2 (NULL: a
-- configured token), ending at $3; deletes sessions that expired a day ago.
WITH old AS (
    DELETE FROM console_sessions WHERE expires_at < now() - interval '1 day'
)
INSERT INTO console_sessions (id, token_id, expires_at) VALUES ($1, $2, $3)
