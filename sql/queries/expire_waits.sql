-- The sweep's expiries: ends up to $1 waits whose `wait_expires_at` has
-- passed, as the request's tenant chose (sql/0037_person_in_the_loop.sql):
-- - WAITING_USER_INPUT, on_reply_timeout 'answer': back to NEW (the
--   analyzer, due now) without a reply; the analyzer finds the question
--   logged and no reply, and is told the user did not reply;
-- - AWAITING_REVIEW, on_review_timeout 'answer': COMPLETED with the answer
--   as it was, logged as the assistant's turn (once per request, as
--   finish.sql logs answers; the raw_logs triggers number it);
-- - 'fail': FAILED, the error naming the limit that ran out.
-- Every daemon sweeps; each wait ends once: a row another sweep (or a
-- reply, a review, a cancel) holds is skipped, and the UPDATE applies only
-- while the row is still in the status it was read in. At most $1 rows.
WITH expired AS (
    SELECT r.id, r.status, r.user_id, r.thread_id, r.final_answer, r.wait_expires_at,
           t.name AS tenant,
           CASE r.status WHEN 'WAITING_USER_INPUT' THEN t.on_reply_timeout ELSE t.on_review_timeout END AS policy,
           CASE r.status WHEN 'WAITING_USER_INPUT' THEN t.user_reply_timeout ELSE t.review_timeout END AS timeout
    FROM pipeline_runs r
    JOIN tenants t ON t.id = r.tenant_id
    -- (pipeline_runs_wait_idx)
    WHERE r.wait_expires_at <= now() AND r.status IN ('WAITING_USER_INPUT', 'AWAITING_REVIEW')
    ORDER BY r.wait_expires_at
    LIMIT $1
    FOR UPDATE OF r SKIP LOCKED
),
moved AS (
    UPDATE pipeline_runs r
    SET status          = CASE
                              WHEN e.policy = 'fail' THEN 'FAILED'
                              WHEN e.status = 'WAITING_USER_INPUT' THEN 'NEW'
                              ELSE 'COMPLETED' END,
        error           = CASE WHEN e.policy = 'fail' THEN format(
                              CASE e.status
                                  WHEN 'WAITING_USER_INPUT'
                                  THEN 'no reply from the user within %s: the wait expired at %s (user_reply_timeout of tenant %s, on_reply_timeout fail)'
                                  ELSE 'no review within %s: the wait expired at %s (review_timeout of tenant %s, on_review_timeout fail)'
                              END,
                              coalesce(e.timeout::text, 'the limit'), e.wait_expires_at, e.tenant) END,
        question        = NULL,
        wait_expires_at = NULL,
        attempt         = 0,
        run_after       = now(),
        updated_at      = now()
    FROM expired e
    WHERE r.id = e.id AND r.status = e.status
    RETURNING r.id, e.status AS was, r.status AS new_status
),
logged AS (
    INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content)
    SELECT e.user_id, e.id, e.thread_id, 'assistant_response', e.final_answer
    FROM moved m
    JOIN expired e ON e.id = m.id
    WHERE m.new_status = 'COMPLETED' AND e.final_answer IS NOT NULL
    ORDER BY e.user_id, e.id
    ON CONFLICT (request_id, message_type) WHERE request_id IS NOT NULL DO NOTHING
)
SELECT id, was, new_status FROM moved
