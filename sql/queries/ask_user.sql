-- A successful analyze attempt that asks the user: request $1, under
-- lease token $2 held by $3, moves from ANALYZING to WAITING_USER_INPUT
-- with its analysis $4 and question $5, and gives its lease up (a wait
-- holds none). Fenced as finish.sql is: only while the row is still in
-- ANALYZING under the same token and owner (a cancelled or reclaimed row
-- changes nothing and returns no row). In the same statement: the step row
-- (attempt $6 started at $7; model $8, tokens $9 and $10, latency $11) and
-- the question logged once as the assistant's turn of the thread (the
-- raw_logs triggers number it). The wait expires after the tenant's
-- user_reply_timeout (never when NULL). The notify trigger announces the
-- new status, so streams and long-polls show the question.
-- Apart from finish.sql, so that a request that does not ask costs
-- nothing more.
WITH moved AS (
    UPDATE pipeline_runs r
    SET status           = 'WAITING_USER_INPUT',
        analysis_result  = $4::jsonb,
        question         = $5::text,
        wait_expires_at  = now() + (SELECT t.user_reply_timeout FROM tenants t WHERE t.id = r.tenant_id),
        lease_owner      = NULL,
        lease_expires_at = NULL,
        held             = false,
        attempt          = 0,
        error            = NULL,
        updated_at       = now()
    WHERE r.id = $1 AND r.lease_token = $2 AND r.status = 'ANALYZING' AND r.lease_owner = $3
    RETURNING r.id, r.user_id, r.thread_id, r.wait_expires_at
),
step AS (
    INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome, model,
                                prompt_tokens, completion_tokens, latency_ms)
    SELECT m.id, 'analyze', $6::int4, $3::text, $7::timestamptz, 'succeeded', $8::text, $9::int4, $10::int4, $11::int4
    FROM moved m
),
logged AS (
    INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content)
    SELECT m.user_id, m.id, m.thread_id, 'assistant_question', $5::text
    FROM moved m
    ON CONFLICT (request_id, message_type) WHERE request_id IS NOT NULL DO NOTHING
)
SELECT id, wait_expires_at FROM moved
