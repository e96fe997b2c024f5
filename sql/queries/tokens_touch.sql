-- Stamps last_used_at of the token with id $1 (found by tokens_by_hash.sql;
-- the HTTP server caches a found token for a few seconds, so this runs
-- about once per token per cache period, not per request).
UPDATE api_tokens SET last_used_at = now() WHERE id = $1
