SELECT id, user_id, thread_id, user_query, status, analysis_result, final_context_payload,
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
WHERE id = $1
