-- Writes the tombstone of user $1 (actor $2, reason $3). From its commit on,
-- the guard triggers (sql/0010_user_data.sql) refuse or drop new writes for
-- the user. No row: a tombstone exists already (see users_state).
INSERT INTO forgotten_users (user_id, actor, reason)
VALUES ($1, $2, $3)
ON CONFLICT (user_id) DO NOTHING
RETURNING requested_at
