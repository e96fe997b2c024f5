-- Whether console session $1 of database token $2 (NULL: a configured
-- token) exists, has not expired and was not ended by a logout.
SELECT EXISTS (
    SELECT FROM console_sessions
    WHERE id = $1 AND token_id IS NOT DISTINCT FROM $2 AND ended_at IS NULL AND expires_at > now()
) AS live
