-- Turns a limited tenant stores outside a request (the MCP tool
-- `remember`), one row each: they count with its requests against
-- `requests_per_minute` (sql/queries/tenants_limit_counts.sql), so every
-- door that writes for a tenant is inside the same limit. Written only
-- for a tenant with a limit, under the lock on its `tenants` row; a
-- tenant's rows older than the minute are deleted as its next turn is
-- counted (sql/queries/tenants_count_turn.sql). No user, no content: only
-- when.
CREATE TABLE tenant_turns (
    tenant_id  uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tenant_turns_recent_idx ON tenant_turns (tenant_id, created_at);
