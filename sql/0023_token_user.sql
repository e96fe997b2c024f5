-- A user bound to an API token (`maasctl tokens create … --user U`): the
-- token acts for that one user of its tenant on every door (the HTTP API,
-- the MCP server), so an agent holding it cannot reach another user's
-- memory by changing an argument. The id is the tenant's own (shown) user
-- id, as the tenant sends it; NULL: the token may name any of its
-- tenant's users, as before.
ALTER TABLE api_tokens ADD COLUMN user_id uuid;
