-- The active prompt of every role.
SELECT role_name, prompt_template, version
FROM system_prompts
WHERE is_active
