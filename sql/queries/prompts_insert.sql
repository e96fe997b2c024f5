-- Adds prompt text $2 as the next version of role $1, active.
INSERT INTO system_prompts (role_name, version, prompt_template, is_active)
SELECT $1::text, coalesce(max(version), 0) + 1, $2::text, true
FROM system_prompts WHERE role_name = $1::text
RETURNING version
