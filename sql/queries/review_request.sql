-- Applies an operator's review to a request's answer while it rests in
-- AWAITING_REVIEW (sql/0037_person_in_the_loop.sql), in one statement: the
-- row is locked, and the verdict applies only while it is still in
-- AWAITING_REVIEW, so of two reviewers (or a reviewer and the sweep's
-- expiry, or a cancel) exactly one changes it; the other finds it moved
-- on and is told its status.
--
-- $1 id  (the request)
-- $2 tenant  (the reviewer's tenant; NULL: an operator of every tenant,
--    `maasctl` or the console's operator)
-- $3 actor  (who reviews, as operator_actions records it)
-- $4 verdict  ('approve', 'edit' or 'reject')
-- $5 text  (edit: the answer the user gets instead)
-- $6 reason  (reject: why; NULL otherwise)
-- $7 then  (reject: 'fail' ends the request FAILED with the reason;
--    'redo' sends it back to the responder, READY, with $8 in its context)
-- $8 note  (redo: the reviewer's note as a block of the context, quoted by
--    the caller, appended to the assembled context)
--
-- Approve and edit: COMPLETED, the answer (edited or not) logged as the
-- assistant's turn, once per request as finish.sql logs answers (the
-- raw_logs triggers number it); the status change rings the doorbell, so
-- followers, long-polls and the callback outbox see it as any completion.
-- Every verdict is recorded in operator_actions ('review_approve',
-- 'review_edit', 'review_reject'), an edit with the original answer.
--
-- No row: unknown id (or another tenant's). Otherwise the status the row
-- had, the one it has now, whether this verdict applied, and since when it
-- had waited (for the wait time histogram).
WITH target AS (
    SELECT id, status, user_id, thread_id, final_answer, updated_at
    FROM pipeline_runs
    WHERE id = $1 AND ($2::uuid IS NULL OR tenant_id = $2::uuid)
    FOR UPDATE
),
moved AS (
    UPDATE pipeline_runs r
    SET status                = CASE $4::text
                                    WHEN 'reject' THEN CASE $7::text WHEN 'redo' THEN 'READY' ELSE 'FAILED' END
                                    ELSE 'COMPLETED' END,
        final_answer          = CASE $4::text
                                    WHEN 'edit' THEN $5::text
                                    WHEN 'reject' THEN CASE $7::text WHEN 'redo' THEN NULL ELSE r.final_answer END
                                    ELSE r.final_answer END,
        final_context_payload = CASE WHEN $4::text = 'reject' AND $7::text = 'redo'
                                     THEN r.final_context_payload || $8::text
                                     ELSE r.final_context_payload END,
        error                 = CASE WHEN $4::text = 'reject' AND $7::text <> 'redo'
                                     THEN left('rejected in review by ' || $3::text || ': ' || $6::text, 100000) END,
        wait_expires_at       = NULL,
        attempt               = 0,
        run_after             = now(),
        updated_at            = now()
    FROM target t
    WHERE r.id = t.id AND t.status = 'AWAITING_REVIEW'
    RETURNING r.id, r.status, r.final_answer
),
logged AS (
    INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content)
    SELECT t.user_id, t.id, t.thread_id, 'assistant_response', m.final_answer
    FROM moved m
    JOIN target t ON t.id = m.id
    WHERE m.status = 'COMPLETED' AND m.final_answer IS NOT NULL
    ON CONFLICT (request_id, message_type) WHERE request_id IS NOT NULL DO NOTHING
),
audit AS (
    INSERT INTO operator_actions (run_id, action, actor, reason, from_status, to_status, detail)
    SELECT t.id, 'review_' || $4::text, $3::text, $6::text, t.status, m.status,
           jsonb_strip_nulls(jsonb_build_object(
               'user_id', t.user_id,
               'then', CASE WHEN $4::text = 'reject' THEN $7::text END,
               'original', CASE WHEN $4::text = 'edit' THEN t.final_answer END,
               'edited', CASE WHEN $4::text = 'edit' THEN $5::text END))
    FROM target t
    JOIN moved m ON m.id = t.id
)
SELECT t.status AS was, coalesce(m.status, t.status) AS status, m.id IS NOT NULL AS applied,
       t.updated_at AS waiting_since
FROM target t
LEFT JOIN moved m ON m.id = t.id
