-- Who may see every tenant in the console, and console sessions that a
-- logout ends.
--
-- `operator`: a token that sees every tenant's requests, users and the
-- engine's state in the console (`maasctl tokens create … --all-tenants`).
-- Without it a console session sees only its token's tenant, whichever
-- tenant that is (the default tenant included). The flag says nothing
-- about the JSON API, where a token always sees only its own tenant.
ALTER TABLE api_tokens ADD COLUMN operator boolean NOT NULL DEFAULT false;

-- One row per console login. The cookie carries the session's random id
-- and an HMAC made with a server secret that is never stored here (a
-- configured `http.session_secret`, or one derived from the configured
-- `api_tokens`), so reading this table, `api_tokens`, a backup or a
-- replica opens no session. A logout sets `ended_at`: the session is over
-- on every daemon at once. `token_id` is the database token it was made
-- from (NULL: a configured token); a revoked token ends its sessions
-- through the token lookup.
CREATE TABLE console_sessions (
    id         uuid        PRIMARY KEY,
    token_id   bigint      REFERENCES api_tokens (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    ended_at   timestamptz
);
-- Expired sessions are deleted at each login, oldest first.
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
