-- The pieces of request $1's streamed answer after attempt $2, seq $3, in
-- order, at most $4: what a client that reconnects (or a follower that
-- missed a notification, or got one without its text) has not seen.
SELECT attempt, seq, text
FROM answer_deltas
WHERE request_id = $1 AND (attempt, seq) > ($2, $3)
ORDER BY attempt, seq
LIMIT $4
