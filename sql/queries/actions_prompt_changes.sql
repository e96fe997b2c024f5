-- The operator console's prompts page: the newest prompt changes
-- (operator_actions_at_idx covers actions on no request).
-- $1 limit
SELECT action, actor, reason, from_status, to_status, detail, at
FROM operator_actions
WHERE run_id IS NULL AND action IN ('prompt_set', 'prompt_activate')
ORDER BY at DESC
LIMIT $1
