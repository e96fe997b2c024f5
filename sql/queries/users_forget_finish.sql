-- Marks the erase of user $1 finished, with what it deleted ($2).
UPDATE forgotten_users SET finished_at = now(), erased = $2
WHERE user_id = $1
