-- The operator actions on one run, oldest first.
SELECT action, actor, reason, from_status, to_status, detail, at
FROM operator_actions
WHERE run_id = $1
ORDER BY id
