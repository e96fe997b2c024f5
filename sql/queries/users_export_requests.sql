-- A page of user $1's requests for the export, oldest first, by keyset on
-- (created_at, id) after ($2, $3) (NULLs: from the first); $4 rows at most.
-- pipeline_runs_user_idx leads with (user_id, created_at). The user id shown
-- is the tenant's own (tenant_user_id, sql/0012_tenants.sql).
SELECT id, coalesce(tenant_user_id, user_id) AS user_id, thread_id, user_query, status, analysis_result, final_context_payload,
       final_answer, error, debug, attempt, run_after, lease_owner, lease_expires_at,
       lease_token, created_at, updated_at, held, callback_url, context_sources, metadata,
       question, wait_expires_at,
       -- The reviews of its answer (review_request.sql), oldest first: who,
       -- when, which verdict, why, and an edit's original and new text.
       (SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                    'action', a.action, 'actor', a.actor, 'reason', a.reason, 'at', a.at,
                    'then', a.detail -> 'then', 'original', a.detail -> 'original',
                    'edited', a.detail -> 'edited')) ORDER BY a.id)
        FROM operator_actions a
        WHERE a.run_id = r.id AND a.action IN ('review_approve', 'review_edit', 'review_reject')) AS reviews
FROM pipeline_runs r
WHERE user_id = $1
  AND ($2::timestamptz IS NULL OR (created_at, id) > ($2::timestamptz, $3::uuid))
ORDER BY created_at, id
LIMIT $4
