-- Deactivates the active prompt of role $1 (in the transaction that
-- activates another one); returns its version.
UPDATE system_prompts SET is_active = false WHERE role_name = $1 AND is_active RETURNING version
