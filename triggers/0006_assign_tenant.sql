-- Tenancy for the SQL interface: every INSERT into pipeline_runs and
-- raw_logs stores the user under the tenant of the role that inserts it,
-- `maas_tenant_user(tenant, user_id)` (sql/0012_tenants.sql), whoever
-- inserts (HTTP, a producer's plain INSERT, psql). Re-applied idempotently.
--
-- Whose a row is:
-- - A producer (a role that may INSERT but not UPDATE the table) inserts
--   for the tenant `tenant_roles` maps it to, or maps a role it is a member
--   of with INHERIT (maas_role_tenant, sql/0035_no_trust_in_the_caller.sql).
--   A producer no mapping covers is refused, as is one that mappings of two
--   tenants cover. Naming another tenant in `tenant_id` is refused; the
--   column's default (the nil id) means "mine".
-- - A trusted role (one that may UPDATE the table: maasd's runtime role,
--   the owner) names the tenant in `tenant_id`, as the HTTP path does.
--
-- The user id:
-- - Already mapped (what the HTTP path writes): `tenant_user_id` is set and
--   `user_id = maas_tenant_user(tenant_id, tenant_user_id)`. A producer can
--   write that too, but only for its own tenant, which is what the mapping
--   would give; so nothing is gained by forging it.
-- - Otherwise `user_id` is the tenant's own id: it is mapped, and kept in
--   `tenant_user_id` where the two differ. A version-8 id there is a stored
--   id (maas never gives out another), and is refused: no INSERT reaches a
--   user by its stored id.
--
-- A producer's turn takes its id from raw_logs' identity: an id it gives
-- (OVERRIDING SYSTEM VALUE, COPY) is refused, since an id planted ahead of
-- the sequence would take the place of a log of maas's own.
--
-- Every function here runs with maas's search_path (pg_catalog, maas's
-- schema, pg_temp; set at the end of the file), whatever the inserting
-- role's path or the functions it created: it calls maas's functions and
-- PostgreSQL's, never a look-alike.
--
-- Cost: the WHEN clauses keep the default tenant's inserts by a trusted
-- role (maasd, the daemon's own turns, psql as the owner) out of PL/pgSQL
-- altogether: one privilege check and three comparisons per row.
--
-- Names: BEFORE triggers fire in name order, and these must fire before the
-- forgotten-user guards (sql/0010_user_data.sql) and raw_logs_track, which
-- key on the stored user id.

-- Refuses `user_id` when it is a stored id (version 8): an INSERT names a
-- user by the id its application knows it by.
CREATE OR REPLACE FUNCTION refuse_stored_user(user_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF get_byte(uuid_send(user_id), 6) >> 4 = 8 THEN
        RAISE EXCEPTION 'user_id % is a stored user id (version 8), not a tenant''s own', user_id
            USING ERRCODE = '22023', COLUMN = 'user_id',
                  HINT = 'name the user by the id its application knows it by';
    END IF;
END
$$;

-- The tenant the inserting role (current_user: a trigger runs as the role
-- whose statement set it off) inserts into `tab` for; refused when no
-- mapping covers the role.
CREATE OR REPLACE FUNCTION producer_tenant(tab name) RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant uuid := maas_role_tenant(current_user);
BEGIN
    IF tenant IS NULL THEN
        RAISE EXCEPTION 'role % may not insert into %: it is mapped to no tenant', current_user, tab
            USING ERRCODE = '42501', TABLE = tab,
                  HINT = 'map it, or a role it is a member of, to its tenant: maasctl tenants grant TENANT --role ROLE '
                         || '(TENANT "default" for the default tenant)';
    END IF;
    RETURN tenant;
END
$$;

CREATE OR REPLACE FUNCTION assign_request_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    stored uuid;
BEGIN
    IF NOT has_table_privilege(TG_RELID, 'UPDATE') THEN
        stored := producer_tenant(TG_TABLE_NAME);
        IF NEW.tenant_id NOT IN (stored, '00000000-0000-0000-0000-000000000000') THEN
            RAISE EXCEPTION 'tenant_id %: role % inserts for its own tenant only', NEW.tenant_id, current_user
                USING ERRCODE = '42501', COLUMN = 'tenant_id',
                      HINT = 'leave tenant_id out: the tenant of a row comes from the role that inserts it (maasctl tenants grant)';
        END IF;
        NEW.tenant_id := stored;
    END IF;
    IF NEW.tenant_user_id IS NOT NULL THEN
        IF NEW.user_id = maas_tenant_user(NEW.tenant_id, NEW.tenant_user_id) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'tenant_user_id % does not match user_id %', NEW.tenant_user_id, NEW.user_id
            USING ERRCODE = '22023', COLUMN = 'tenant_user_id',
                  HINT = 'leave tenant_user_id out and put the tenant''s own user id in user_id';
    END IF;
    PERFORM refuse_stored_user(NEW.user_id);
    stored := maas_tenant_user(NEW.tenant_id, NEW.user_id);
    IF stored <> NEW.user_id THEN
        NEW.tenant_user_id := NEW.user_id;
        NEW.user_id := stored;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS pipeline_runs_assign_tenant ON pipeline_runs;
CREATE TRIGGER pipeline_runs_assign_tenant
    BEFORE INSERT ON pipeline_runs
    FOR EACH ROW
    WHEN (NOT has_table_privilege('pipeline_runs'::regclass, 'UPDATE')
          OR NEW.tenant_id <> '00000000-0000-0000-0000-000000000000'
          OR NEW.tenant_user_id IS NOT NULL
          OR get_byte(uuid_send(NEW.user_id), 6) >> 4 = 8)
    EXECUTE FUNCTION assign_request_tenant();

-- A producer's turn: raw_logs has no tenant column, so the tenant is always
-- the role's. A trusted role's turns (the daemon's answers, the logged
-- query of every request) carry stored ids and pass as they are.
-- `id` and `request_id` are maas's to set: an id ahead of the identity
-- would take the place of a log of maas's (sql/0035_no_trust_in_the_caller.sql,
-- maas_turn_id_drawn), and the unique index on `request_id` would let a
-- producer's turn take a request's place.
CREATE OR REPLACE FUNCTION assign_turn_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT maas_turn_id_drawn(NEW.id) THEN
        RAISE EXCEPTION 'id %: a producer''s turn cannot choose its id', NEW.id
            USING ERRCODE = 'generated_always', COLUMN = 'id', TABLE = TG_TABLE_NAME,
                  HINT = 'leave id out (no OVERRIDING SYSTEM VALUE, no id column in COPY): maas numbers turns itself';
    END IF;
    IF NEW.request_id IS NOT NULL THEN
        RAISE EXCEPTION 'request_id %: a producer''s turn cannot name a request', NEW.request_id
            USING ERRCODE = '42501', COLUMN = 'request_id',
                  HINT = 'leave request_id out: maas logs the turns of its requests itself';
    END IF;
    PERFORM refuse_stored_user(NEW.user_id);
    NEW.user_id := maas_tenant_user(producer_tenant(TG_TABLE_NAME), NEW.user_id);
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS raw_logs_assign_tenant ON raw_logs;
CREATE TRIGGER raw_logs_assign_tenant
    BEFORE INSERT ON raw_logs
    FOR EACH ROW
    WHEN (NOT has_table_privilege('raw_logs'::regclass, 'UPDATE'))
    EXECUTE FUNCTION assign_turn_tenant();

-- maas's search_path for every function of this file (CREATE OR REPLACE
-- above cleared it).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION refuse_stored_user(uuid) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION producer_tenant(name) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION assign_request_tenant() SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION assign_turn_tenant() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;
