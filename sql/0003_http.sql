-- The HTTP API: durable idempotency keys, and a cheap count of failed requests.

-- A client that retries `POST /api/query` with the same `Idempotency-Key`
-- gets its first request back instead of a second one. Keys are scoped to
-- the user of the request and expire (`http.idempotency_ttl_secs`); the
-- fingerprint (SHA-256 of thread and query) tells a retry from a different
-- request that reuses the key. The key row and its request are inserted by
-- one statement, so neither exists without the other.
CREATE TABLE http_idempotency_keys (
    user_id     uuid        NOT NULL,
    key         text        NOT NULL,
    request_id  uuid        NOT NULL REFERENCES pipeline_runs (id) ON DELETE CASCADE,
    fingerprint text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, key),
    CONSTRAINT http_idempotency_keys_key_size CHECK (length(key) BETWEEN 1 AND 255)
);
-- Expiry sweeps.
CREATE INDEX http_idempotency_keys_created_idx ON http_idempotency_keys (created_at);
-- The cascade from pipeline_runs.
CREATE INDEX http_idempotency_keys_request_idx ON http_idempotency_keys (request_id);

-- `maas_requests_failed` in /metrics counts these without scanning the table.
CREATE INDEX pipeline_runs_failed_idx ON pipeline_runs (updated_at) WHERE status = 'FAILED';
