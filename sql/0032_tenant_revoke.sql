-- `maasctl tenants revoke` joins the audit trail's list (added to whatever
-- the constraint lists now, as 0020 does): it removes a database role's
-- mapping to a tenant (sql/queries/tenants_revoke.sql).
DO $$
DECLARE def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def
    FROM pg_constraint
    WHERE conname = 'operator_actions_action_valid' AND conrelid = 'operator_actions'::regclass;
    IF def IS NOT NULL AND position('tenant_revoke' IN def) = 0 THEN
        EXECUTE 'ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_valid';
        EXECUTE 'ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_valid '
            || replace(def, 'ARRAY[', 'ARRAY[''tenant_revoke''::text, ');
    END IF;
END
$$;
