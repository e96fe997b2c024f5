-- A page of user $1's requests for the export, oldest first, by keyset on
-- (created_at, id) after ($2, $3) (NULLs: from the first); $4 rows at most.
-- pipeline_runs_user_idx leads with (user_id, created_at). The user id shown
-- is the tenant's own (tenant_user_id, sql/0012_tenants.sql).
SELECT id, coalesce(tenant_user_id, user_id) AS user_id, thread_id, user_query, status, analysis_result, final_context_payload,
       final_answer, error, debug, attempt, run_after, lease_owner, lease_expires_at,
       lease_token, created_at, updated_at, held, callback_url, context_sources, metadata,
       question, wait_expires_at
FROM pipeline_runs
WHERE user_id = $1
  AND ($2::timestamptz IS NULL OR (created_at, id) > ($2::timestamptz, $3::uuid))
ORDER BY created_at, id
LIMIT $4
