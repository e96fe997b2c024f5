-- Parameters, in the order `SubmitParams` (src/repo/idempotency.rs) binds them (a unit test
-- compares the two lists):
-- $1  user_id
-- $2  thread_id
-- $3  query
-- $4  key
-- $5  fingerprint
-- $6  ttl_secs
-- $7  callback_url
-- $8  debug
-- $9  tenant_id
-- $10 metadata
-- $11 stream
-- $12 clarify (NULL: the tenant's `hitl_clarify`)
-- $13 review  (true asks for an operator's review; false leaves it to the
--     tenant's `hitl_review`, stored as NULL)
--
-- Inserts a request under an idempotency key ($4, scoped to user $1, with
-- fingerprint $5), in one statement: the key row and the request exist
-- together or not at all. A key that is still fresh (younger than $6
-- seconds) is left alone and nothing is returned: the caller then reads the
-- key's first request with find_idempotent (a new statement, so it sees the
-- row a concurrent duplicate just committed; ON CONFLICT waited for it).
-- An expired key is taken over by this request. The key and the request
-- are the stored user's, maas_tenant_user($9, $1) (sql/0012_tenants.sql).
WITH key AS (
    INSERT INTO http_idempotency_keys AS k (user_id, key, request_id, fingerprint)
    VALUES (maas_tenant_user($9, $1), $4, gen_random_uuid(), $5)
    ON CONFLICT (user_id, key) DO UPDATE
        SET request_id = EXCLUDED.request_id, fingerprint = EXCLUDED.fingerprint, created_at = now()
        WHERE k.created_at < now() - make_interval(secs => $6)
    RETURNING request_id
)
INSERT INTO pipeline_runs (id, user_id, thread_id, user_query, callback_url, debug, tenant_id, tenant_user_id, metadata, stream,
                           clarify, review)
SELECT request_id, maas_tenant_user($9, $1), $2, $3, $7, $8, $9,
       CASE WHEN maas_tenant_user($9, $1) <> $1 THEN $1 END, $10, $11, $12, CASE WHEN $13::bool THEN true END
FROM key
RETURNING id
