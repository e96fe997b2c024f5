-- No caller's environment changes what maas runs (invariant 13,
-- docs/invariants.md), for the functions the triggers call.
--
-- A trigger runs as the role whose INSERT sets it off, with that role's
-- search_path. A producer that owns a schema (`CREATE SCHEMA AUTHORIZATION
-- app`: its schema comes first on the default path, `"$user", public`)
-- defined `app.maas_tenant_user(uuid, uuid)`, and the tenant trigger called
-- it instead of maas's. Now:
-- - every trigger function (triggers/*.sql) and every function one calls
--   runs with `search_path = pg_catalog, <maas's schema>, pg_temp` (fixed
--   here and in the trigger files, the schema computed when migrating, as
--   sql/0020_tenant_roles.sql does): nothing the caller creates elsewhere,
--   nor a path that puts its schema before pg_catalog, is on it; pg_temp
--   last is never searched for functions;
-- - the SQL functions that are inlined into the calling statement (a SET
--   clause would stop that) get bodies in the standard syntax (`RETURN
--   …`), whose names are bound when the function is created, not looked up
--   when it is called (as maas_event's, sql/0031_event_payloads.sql).
-- What remains is maas's own schema: a role that may CREATE there can
-- shadow maas's objects for every statement maas runs, not only the
-- triggers; no producer gets that right (docs/deploying.md, "Producer
-- roles"; `maasctl doctor` warns).
--
-- A role's tenant follows role membership: a role mapped to a tenant
-- covers the roles that are members of it with INHERIT (how teams grant: a
-- NOLOGIN group holds the grants, login roles are its members). The lookup
-- matched current_user by name, so a group's member was unmapped and fell
-- to the default tenant. A role mapped to no tenant now inserts nothing
-- and reads nothing (the default tenant maps its producers explicitly,
-- `maasctl tenants grant default --role …`), and a role covered by two
-- tenants' mappings is refused, naming both.

-- The stored user id (sql/0012_tenants.sql), the same expression, with its
-- names bound now. Still inlined into the calling statement.
CREATE OR REPLACE FUNCTION maas_tenant_user(tenant uuid, user_id uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN tenant = '00000000-0000-0000-0000-000000000000'::uuid
         AND get_byte(uuid_send(user_id), 6) >> 4 <> 8 THEN user_id
    ELSE encode(substring(
             set_byte(set_byte(sha256('maas-tenant-user:'::bytea || uuid_send(tenant) || uuid_send(user_id)),
                 6, (get_byte(sha256('maas-tenant-user:'::bytea || uuid_send(tenant) || uuid_send(user_id)), 6) & 15) | 128),
                 8, (get_byte(sha256('maas-tenant-user:'::bytea || uuid_send(tenant) || uuid_send(user_id)), 8) & 63) | 128)
             FROM 1 FOR 16), 'hex')::uuid
END;

-- The erase lock's key (sql/0010_user_data.sql), the same expression, with
-- its names bound now.
CREATE OR REPLACE FUNCTION maas_user_erase_key(u uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (x'6d75'::bigint << 32) | (hashtext(u::text) & 63)::bigint;

-- The tenant role `r` inserts for: the tenant of the mapping of `r` or of
-- a role `r` is a member of with INHERIT (pg_has_role … 'USAGE': the
-- rights `r` uses without SET ROLE, the same that let it insert). NULL
-- when none covers it; refused when mappings of two tenants do, naming
-- them. A mapping whose role was dropped covers no one. SECURITY DEFINER:
-- a producer has no grant on tenant_roles; called with a role its session
-- is not a member of, it answers NULL, so a caller learns the tenants of
-- its own roles and nothing else.
CREATE OR REPLACE FUNCTION maas_role_tenant(r name) RETURNS uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    tenant uuid;
    tenants bigint;
    via text;
BEGIN
    IF NOT pg_has_role(session_user, r, 'MEMBER') THEN
        RETURN NULL;
    END IF;
    SELECT min(m.tenant_id::text)::uuid, count(DISTINCT m.tenant_id),
           string_agg(t.name || ' (role ' || m.role::text || ')', ', ' ORDER BY t.name, m.role)
    INTO tenant, tenants, via
    FROM tenant_roles m
    JOIN pg_roles g ON g.rolname = m.role
    JOIN tenants t ON t.id = m.tenant_id
    WHERE pg_has_role(r, g.oid, 'USAGE');
    IF tenants > 1 THEN
        RAISE EXCEPTION 'role % is covered by the roles of % tenants: %', r, tenants, via
            USING ERRCODE = '42501',
                  HINT = 'a role inserts for one tenant: REVOKE all but one of those roles from it, '
                         || 'or remove a mapping (maasctl tenants roles, maasctl tenants revoke)';
    END IF;
    RETURN tenant;
END
$$;

-- Whether `id` is the value raw_logs' identity last handed to this
-- session: it is, for a row whose id the identity gave (each row draws its
-- value just before its BEFORE triggers run); it is not for an id given
-- with OVERRIDING SYSTEM VALUE or by COPY, unless it is one the identity
-- handed to this session already (then no other row can have it). An id
-- nobody was given is what a producer planted to take the place of
-- maas's own logs, whose inserts skip a conflict on their request's log.
-- SECURITY DEFINER: currval needs a grant on the sequence that a producer
-- does not hold.
CREATE FUNCTION maas_turn_id_drawn(id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
BEGIN
    RETURN id = currval(pg_get_serial_sequence('raw_logs', 'id')::regclass);
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    -- (no value drawn in this session)
    RETURN false;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION maas_role_tenant(name) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION maas_turn_id_drawn(bigint) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION refuse_forgotten_request() SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION drop_forgotten_write() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;

-- A producer's results: its own tenant's requests (the tenant of the
-- reading role, by membership as above); a role mapped to no tenant reads
-- nothing. The tenant is looked up once per query (an initplan), not per
-- row.
CREATE OR REPLACE VIEW maas_my_requests WITH (security_barrier) AS
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
WHERE r.tenant_id = (SELECT maas_role_tenant(current_user));
