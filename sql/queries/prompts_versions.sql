-- The operator console's prompts page: every version of role $1, newest
-- first (system_prompts_role_version_key).
SELECT version, is_active, created_at, length(prompt_template) AS chars
FROM system_prompts
WHERE role_name = $1
ORDER BY version DESC
