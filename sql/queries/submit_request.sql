-- Inserts a request submitted over HTTP for tenant $6; the triggers ring
-- the doorbell and log the query, as for any other insert. The stored user
-- is maas_tenant_user($6, $1) (sql/0012_tenants.sql); the tenant's own id
-- is kept in tenant_user_id where it differs (NULL for the default tenant's
-- users but version-8 ids). $7 is the client's metadata object; $8 asks for
-- the answer's pieces while it is written (`stream`); $9 lets the
-- analyzer ask the user (`clarify`; NULL: the tenant's setting); $10 asks
-- for an operator's review of the answer (`review`: true, or NULL to leave
-- it to the tenant's `hitl_review`).
INSERT INTO pipeline_runs (user_id, thread_id, user_query, callback_url, debug, tenant_id, tenant_user_id, metadata, stream,
                           clarify, review)
VALUES (maas_tenant_user($6, $1), $2, $3, $4, $5, $6,
        CASE WHEN maas_tenant_user($6, $1) <> $1 THEN $1 END, $7, $8, $9, CASE WHEN $10::bool THEN true END)
RETURNING id
