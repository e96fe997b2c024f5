-- The user of request $1 as tenant $2 names it (the shown id); no row when
-- the request is not tenant $2's.
SELECT coalesce(tenant_user_id, user_id) AS user_id
FROM pipeline_runs
WHERE id = $1 AND tenant_id = $2
