SELECT id, user_id, thread_id, user_query, status, analysis_result, final_context_payload,
       final_answer, error, debug, attempt, run_after, lease_owner, lease_expires_at,
       lease_token, created_at, updated_at, held, callback_url, context_sources, metadata,
       question, wait_expires_at
FROM pipeline_runs
WHERE id = $1
