-- Tenants: several applications served by one maas, each with its own
-- users, tokens, limits and callback signing secret.
--
-- A tenant's user ids are its own namespace by construction: the user id
-- stored in every table (`pipeline_runs.user_id`, `raw_logs`, `lsm_storage`,
-- `archive_marks`, ...) is `maas_tenant_user(tenant, user)`, computed here in
-- SQL. For the default tenant it is the user id itself (so every existing
-- row, and a plain INSERT that names no tenant, stays the default tenant's);
-- for any other tenant it is a name-based UUID (version 8, RFC 9562: the
-- first 128 bits of SHA-256 over the tenant and the user, version and
-- variant bits set). So that the default tenant cannot name another
-- tenant's stored user, a version-8 id of the default tenant is mapped the
-- same way (with the nil tenant); every other id of it stays itself. Every statement that keys on user_id (memory,
-- archivist, retention, export, erase) therefore never sees another
-- tenant's user, without a tenant column of its own.

-- The default tenant: the configuration's `api_tokens` and the loopback
-- mode without tokens act as this one. Its id is the nil UUID.
CREATE TABLE tenants (
    id                  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    name                text        NOT NULL UNIQUE,
    -- Submissions per rolling minute; NULL: unlimited.
    requests_per_minute integer,
    -- Requests not yet terminal; NULL: unlimited.
    max_in_flight       integer,
    -- Signs the callbacks of this tenant's requests; NULL: the configured
    -- `callbacks.secret`.
    callback_secret     text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenants_name_form CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    CONSTRAINT tenants_rpm_positive CHECK (requests_per_minute IS NULL OR requests_per_minute > 0),
    CONSTRAINT tenants_in_flight_positive CHECK (max_in_flight IS NULL OR max_in_flight > 0),
    -- The default tenant's rows are not in the limit indexes below.
    CONSTRAINT tenants_default_unlimited CHECK (id <> '00000000-0000-0000-0000-000000000000'
                                                OR (requests_per_minute IS NULL AND max_in_flight IS NULL)),
    CONSTRAINT tenants_secret_size CHECK (callback_secret IS NULL OR length(callback_secret) BETWEEN 16 AND 512)
);
INSERT INTO tenants (id, name) VALUES ('00000000-0000-0000-0000-000000000000', 'default');

-- The stored user id of `user_id` as tenant `tenant` names it: the first
-- 16 bytes of SHA-256('maas-tenant-user:' || tenant || user_id) (the raw
-- UUID bytes), version 8 and variant bits set. A single expression of
-- immutable functions with no subquery and not STRICT, so PostgreSQL
-- inlines it into the calling statement: for the default tenant it costs
-- two comparisons (a non-inlined SQL function is planned at every call).
CREATE FUNCTION maas_tenant_user(tenant uuid, user_id uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN tenant = '00000000-0000-0000-0000-000000000000'::uuid
             AND get_byte(uuid_send(user_id), 6) >> 4 <> 8 THEN user_id
        ELSE encode(substring(
                 set_byte(set_byte(sha256('maas-tenant-user:'::bytea || uuid_send(tenant) || uuid_send(user_id)),
                     6, (get_byte(sha256('maas-tenant-user:'::bytea || uuid_send(tenant) || uuid_send(user_id)), 6) & 15) | 128),
                     8, (get_byte(sha256('maas-tenant-user:'::bytea || uuid_send(tenant) || uuid_send(user_id)), 8) & 63) | 128)
                 FROM 1 FOR 16), 'hex')::uuid
    END
$$;

-- API tokens: only the SHA-256 of a token is kept; the token is shown once,
-- at creation (`maasctl tokens create`).
CREATE TABLE api_tokens (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL,
    tenant_id    uuid        NOT NULL REFERENCES tenants (id),
    scope        text        NOT NULL,
    token_sha256 bytea       NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz,
    CONSTRAINT api_tokens_scope_known CHECK (scope IN ('submit', 'read', 'operate', 'admin')),
    CONSTRAINT api_tokens_hash_size CHECK (length(token_sha256) = 32),
    CONSTRAINT api_tokens_name_form CHECK (length(name) BETWEEN 1 AND 100)
);
-- One live token per name and tenant (rotate revokes the old one first).
CREATE UNIQUE INDEX api_tokens_live_name_idx ON api_tokens (tenant_id, name) WHERE revoked_at IS NULL;

-- Whose a request is. The default keeps a plain INSERT the default
-- tenant's. No foreign key: tenants are never deleted, and the check would
-- cost every insert a lookup. `tenant_user_id` is the user id as the tenant
-- sent it, for answers to the tenant (NULL where it equals user_id).
ALTER TABLE pipeline_runs
    ADD COLUMN tenant_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    ADD COLUMN tenant_user_id uuid;

-- Per-tenant limits count here; the default tenant's rows are not in these
-- indexes (its submissions without limits never read them).
CREATE INDEX pipeline_runs_tenant_recent_idx ON pipeline_runs (tenant_id, created_at)
    WHERE tenant_id <> '00000000-0000-0000-0000-000000000000';
CREATE INDEX pipeline_runs_tenant_in_flight_idx ON pipeline_runs (tenant_id)
    WHERE tenant_id <> '00000000-0000-0000-0000-000000000000'
      AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- The actions of `maasctl tenants|tokens` join the audit trail's list
-- (added to whatever the constraint lists now, as 0010 does).
DO $$
DECLARE def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def
    FROM pg_constraint
    WHERE conname = 'operator_actions_action_valid' AND conrelid = 'operator_actions'::regclass;
    IF def IS NOT NULL AND position('token_create' IN def) = 0 THEN
        EXECUTE 'ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_valid';
        EXECUTE 'ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_valid '
            || replace(def, 'ARRAY[',
                       'ARRAY[''tenant_add''::text, ''tenant_set''::text, ''token_create''::text, '
                       || '''token_revoke''::text, ');
    END IF;
END
$$;
