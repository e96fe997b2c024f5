-- Ends console session $1 (a logout); ending an ended one changes nothing.
UPDATE console_sessions SET ended_at = now() WHERE id = $1 AND ended_at IS NULL
