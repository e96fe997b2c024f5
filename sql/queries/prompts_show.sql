-- One prompt of role $1: version $2, or the active one when $2 is NULL.
SELECT role_name, version, is_active, created_at, prompt_template
FROM system_prompts
WHERE role_name = $1 AND ($2::int4 IS NULL AND is_active OR version = $2::int4)
ORDER BY version DESC
LIMIT 1
