-- Users whose erase began more than $1 seconds ago and has not finished
-- (a daemon died mid-erase), oldest first, at most 100.
-- $1 older_than_secs
SELECT user_id
FROM forgotten_users
WHERE finished_at IS NULL AND requested_at < now() - make_interval(secs => $1)
ORDER BY requested_at
LIMIT 100
