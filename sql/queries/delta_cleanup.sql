-- Deletes the pieces of request $1's streamed answer up to attempt $2 (its
-- publisher's, shortly after the attempt ended: the terminal state carries
-- the whole answer), and any row older than $3 seconds that a daemon which
-- died before its cleanup left behind.
DELETE FROM answer_deltas
WHERE (request_id = $1 AND attempt <= $2)
   OR created_at < now() - make_interval(secs => $3)
