-- Records a batch of finished stage attempts in one statement. Each result
-- is fenced: it applies only while the row is still in that stage's
-- in-flight status under the same lease token and owner. Rows that no longer match
-- (lease lost, cancelled) change nothing and are absent from the result.
-- For each applied result it also writes the step history row and, for a
-- successful respond stage, the assistant_response log (same transaction).
WITH input AS (
    SELECT *
    FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::int4[], $8::timestamptz[], $9::jsonb[], $10::text[], $11::text[],
                $12::text[], $13::text[], $14::int8[], $15::text[], $16::int4[],
                $17::int4[], $18::int4[])
        AS t(id, token, stage, in_flight, new_status, outcome,
             attempt, started_at, analysis, context, answer,
             error_class, error_message, delay_ms, model, prompt_tokens,
             completion_tokens, latency_ms)
),
done AS (
    UPDATE pipeline_runs r
    SET status                = i.new_status,
        analysis_result       = coalesce(i.analysis, r.analysis_result),
        final_context_payload = coalesce(i.context, r.final_context_payload),
        final_answer          = coalesce(i.answer, r.final_answer),
        error                 = CASE i.outcome
                                    WHEN 'succeeded' THEN NULL
                                    WHEN 'released' THEN r.error
                                    ELSE i.error_message END,
        attempt               = CASE i.outcome
                                    WHEN 'succeeded' THEN 0
                                    WHEN 'released' THEN greatest(r.attempt - 1, 0)
                                    WHEN 'deferred' THEN greatest(r.attempt - 1, 0)
                                    ELSE r.attempt END,
        run_after             = now() + i.delay_ms * interval '1 millisecond',
        -- Debug mode: a debug run rests after each successful stage that
        -- leads to a dispatchable status, until an operator continues it.
        held                  = r.debug AND i.outcome = 'succeeded' AND i.new_status IN ('ANALYZED', 'READY'),
        lease_owner           = NULL,
        lease_expires_at      = NULL,
        updated_at            = now()
    FROM input i
    WHERE r.id = i.id AND r.lease_token = i.token AND r.status = i.in_flight AND r.lease_owner = $19
    RETURNING r.id, r.user_id, r.thread_id
),
steps AS (
    INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome,
                                error_class, error_message, model, prompt_tokens,
                                completion_tokens, latency_ms)
    SELECT i.id, i.stage, i.attempt, $19, i.started_at, i.outcome,
           i.error_class, i.error_message, i.model, i.prompt_tokens,
           i.completion_tokens, i.latency_ms
    FROM input i JOIN done d ON d.id = i.id
),
logged AS (
    INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content)
    SELECT d.user_id, d.id, d.thread_id, 'assistant_response', i.answer
    FROM input i JOIN done d ON d.id = i.id
    WHERE i.stage = 'respond' AND i.outcome = 'succeeded' AND i.answer IS NOT NULL
    -- Each log locks its user's archive_marks row (triggers/0003); taking
    -- them in user order keeps two daemons' batches from deadlocking.
    ORDER BY d.user_id
    ON CONFLICT DO NOTHING
)
SELECT id FROM done
