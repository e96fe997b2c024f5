-- Activates version $2 of role $1 (after prompts_deactivate in the same
-- transaction); no row when there is no such version.
UPDATE system_prompts SET is_active = true WHERE role_name = $1 AND version = $2 RETURNING version
