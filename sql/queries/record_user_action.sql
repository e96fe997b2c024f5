-- Records an operator action about user $5's memory (detail names the
-- user), unless the user has a tombstone: the erase deletes such rows, and
-- one written after it would outlive the forget. Run after
-- actions_user_guard in the same transaction, so this statement's snapshot
-- sees any tombstone that committed before the guard was passed.
-- $1 action
-- $2 actor
-- $3 reason
-- $4 detail
-- $5 user_id
INSERT INTO operator_actions (action, actor, reason, detail)
SELECT $1, $2, $3, $4
WHERE NOT EXISTS (SELECT 1 FROM forgotten_users WHERE user_id = $5)
RETURNING id
