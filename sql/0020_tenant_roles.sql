-- Producers: database roles of other applications that INSERT requests and
-- turns themselves (the SQL interface), each for one tenant.
--
-- Which tenant a row belongs to comes from the role that inserts it, never
-- from a column the producer chooses: `tenant_roles` maps a role to its
-- tenant (`maasctl tenants grant`); a role with no row is the default
-- tenant's. The triggers of triggers/0006_assign_tenant.sql apply it on
-- every INSERT into pipeline_runs and raw_logs. A role that may UPDATE the
-- table (maasd's runtime role, the owner) could rewrite any row anyway, so
-- it is trusted to name the tenant in the column (the HTTP path does); such
-- a role cannot be mapped.
CREATE TABLE tenant_roles (
    role       name        PRIMARY KEY,
    tenant_id  uuid        NOT NULL REFERENCES tenants (id),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The tenant role `r` inserts for; NULL when it has none (the default
-- tenant). SECURITY DEFINER: the trigger runs as the producer, which has no
-- grant on tenant_roles; it reveals which tenant a role is mapped to and
-- nothing else.
CREATE FUNCTION maas_role_tenant(r name) RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT tenant_id FROM tenant_roles WHERE role = r
$$;

-- A producer holds INSERT on pipeline_runs and raw_logs and nothing else,
-- so the triggers that its INSERT sets off and that read or write other
-- tables run as their owner. (The trigger files do the same for theirs.)
ALTER FUNCTION refuse_forgotten_request() SECURITY DEFINER;
ALTER FUNCTION drop_forgotten_write() SECURITY DEFINER;

-- Every SECURITY DEFINER function resolves names in this schema only (and
-- never in the caller's temporary schema), wherever maas is installed.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION maas_role_tenant(name) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION refuse_forgotten_request() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION drop_forgotten_write() SET search_path = %I, pg_temp', current_schema());
END
$$;

-- What a producer reads: the requests of its own tenant (the tenant of
-- current_user, as above), each with the user id as the tenant knows it.
-- Owned by the owner, so it reads pipeline_runs with the owner's rights
-- while a producer holds SELECT on the view alone; security_barrier keeps
-- the producer's own conditions from running before the tenant filter.
CREATE VIEW maas_my_requests WITH (security_barrier) AS
SELECT r.id,
       coalesce(r.tenant_user_id, r.user_id) AS user_id,
       r.thread_id,
       r.user_query,
       r.status,
       r.final_answer,
       r.error,
       r.metadata,
       r.created_at,
       r.updated_at
FROM pipeline_runs r
WHERE r.tenant_id = coalesce((SELECT m.tenant_id FROM tenant_roles m WHERE m.role = current_user),
                             '00000000-0000-0000-0000-000000000000');

-- `maasctl tenants grant` joins the audit trail's list (added to whatever
-- the constraint lists now, as 0010 does).
DO $$
DECLARE def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def
    FROM pg_constraint
    WHERE conname = 'operator_actions_action_valid' AND conrelid = 'operator_actions'::regclass;
    IF def IS NOT NULL AND position('tenant_grant' IN def) = 0 THEN
        EXECUTE 'ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_valid';
        EXECUTE 'ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_valid '
            || replace(def, 'ARRAY[', 'ARRAY[''tenant_grant''::text, ');
    END IF;
END
$$;
