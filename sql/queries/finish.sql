-- Parameters, in the order `FinishParams` (src/repo/attempts.rs) binds them
-- (a unit test compares the two lists). Each is an array with one element
-- per result, in the batch's order, except the scalars $19 and $21.
-- NULL where the result has no such value.
--
-- The attempt (a `pipeline_steps` row, and the fence):
-- $1  id  (the request: `pipeline_runs.id`)
-- $2  token  (the lease token the attempt ran under; the fence)
-- $3  stage  (analyze, assemble or respond)
-- $4  in_flight  (the stage's in-flight status; the fence)
-- $5  new_status  (the status the attempt's outcome moves the row to,
--     before fusing and chaining; AWAITING_REVIEW for an answer that
--     awaits an operator's review: it is stored, not logged, and waits
--     until the tenant's review_timeout)
-- $6  outcome  (succeeded, retrying, deferred, failed or released)
-- $7  attempt  (the attempt number the step records)
-- $8  started_at  (when the attempt's claim was made)
-- What it produced (a success: one of $9, $10, $11 by stage):
-- $9  analysis  (the analyzer's analysis)
-- $10 context  (the assembler's context, or the fused assemble stage's)
-- $11 answer  (the responder's answer)
-- Why it did not succeed, and when the row is due again:
-- $12 error_class  (the failure's class)
-- $13 error_message  (what an operator reads; `pipeline_runs.error`)
-- $14 delay_ms  (how long a retried or deferred row waits; 0 otherwise)
-- The model's usage in the attempt:
-- $15 model
-- $16 prompt_tokens
-- $17 completion_tokens
-- $18 latency_ms  (how long the attempt ran)
-- $19 worker  (the finishing daemon, the leases' owner; scalar)
-- $20 chain_to  (the next stage's in-flight status to claim the row for, or
--     NULL: see Chaining)
-- $21 lease_secs  (the lease of a chained claim, in seconds; scalar)
-- $22 fused_in  (true when the result carries a fused assemble stage)
-- $23 fused_tokens  (the fused assemble stage's tokens)
-- $24 fused_latency_ms  (the fused assemble stage's latency)
-- $25 context_sources  (the memory the context of $10 holds)
-- The respond stage fused after the fused assemble, when it answered:
-- $26 fused_answer  (its answer, or NULL when there is none)
-- $27 fused_model
-- $28 fused_prompt_tokens
-- $29 fused_completion_tokens
-- $30 fused_respond_latency_ms
--
-- The fused stages ($22 to $30) are columns of their analyze result, not
-- rows of their own: they share its fence, its row and its RETURNING, and
-- the step rows they add are built from `done` below. Sending them as rows
-- of the same arrays instead would drop nine parameters but add a join of
-- the input with itself by request, and rows with no fence of their own;
-- that form was not measured against this one on a batch, so the columns
-- stay.
--
-- Records a batch of finished stage attempts in one statement. Each result
-- is fenced: it applies only while the row is still in that stage's
-- in-flight status under the same lease token and owner. Rows that no longer match
-- (lease lost, cancelled) change nothing and are absent from the result.
-- A batch may hold two results for one row (a claim that a database crash
-- forgot, and the row claimed again): only the current lease's applies,
-- and each applied row names the token it applied under (`result_token`).
-- For each applied result it also writes the step history row and, for a
-- successful respond stage, the assistant_response log (same statement).
--
-- Fusing: a successful analyze result with `fused` ($22) also carries the
-- assemble stage's output in `context`, run by the daemon right after the
-- analyzer on the memory the analyzer was given. The row then moves past
-- ASSEMBLING to READY and gets both step rows (the assemble step with the
-- tokens $23 and latency $24). Not for a debug request, nor while the daemons
-- are paused: the context is dropped and the row rests in ANALYZED.
--
-- Chaining: a successful result whose `chain_to` ($20) names the next
-- stage's in-flight status is claimed for that stage by the same UPDATE,
-- leased to $19 for $21 seconds, as `claim.sql` would (attempt 1, token
-- bumped), unless it is a debug request (it rests instead) or the daemons
-- are paused. The row moves in one step from one in-flight status to the
-- next: one row version, one commit. The statuses it passes through
-- (ANALYZED, ASSEMBLING, READY) never exist outside this transaction, but
-- each is still announced: `passed` sends their notifications, in order,
-- before the trigger sends the new status's, so `pipeline_events` carries
-- every status change as if the row had been updated once per status.
-- Theirs say `"passed": true`: no daemon is woken to claim a status the
-- row is no longer in.
--
-- Fusing the respond stage too: a fused analyze result that also carries
-- an answer ($26, the respond stage run on the fused context while the
-- first two were being finished) moves the row from ANALYZING to
-- COMPLETED: one row version, the three step rows, the answer's log, and
-- ANALYZED, ASSEMBLING, READY and RESPONDING announced before COMPLETED.
-- Same conditions as the fused assemble (not debug, not paused: the
-- answer is then dropped with the context).
-- How the batch finds its rows: by primary key, whatever the statistics
-- say. `input` is materialised, the lease owner is one of its columns, and
-- the rows are also named by `id = ANY($1)`. Joined to the unnested arrays
-- directly, with `lease_owner = $19` as a filter on the table, the planner
-- trusted statistics gathered while no lease was held (an owner is then
-- never there, one row expected), scanned the whole table and unnested the
-- twenty-eight arrays again for every in-flight row it found: 0.4 s for a batch of
-- 128 among 1,000 leased rows of 20,000, against 0.02 s by key. Custom plans
-- (each connection's first five executions, every execution through a
-- transaction pooler) met this; the generic plan did not.
WITH input AS MATERIALIZED (
    SELECT t.*, $19::text AS owner,
           -- (an answer written now ends the request: there is no stage
           -- left to claim, whatever the caller asked to chain to)
           CASE WHEN t.outcome = 'succeeded' AND NOT paused.on
                     AND NOT (t.stage = 'analyze' AND t.fused_in AND t.fused_answer IS NOT NULL)
                THEN t.chain_to END AS chain,
           (t.stage = 'analyze' AND t.outcome = 'succeeded' AND t.fused_in AND NOT paused.on) AS fused,
           (t.stage = 'analyze' AND t.outcome = 'succeeded' AND t.fused_in AND NOT paused.on
            AND t.fused_answer IS NOT NULL) AS responds
    FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::int4[], $8::timestamptz[], $9::jsonb[], $10::text[], $11::text[],
                $12::text[], $13::text[], $14::int8[], $15::text[], $16::int4[],
                $17::int4[], $18::int4[], $20::text[], $22::bool[], $23::int4[], $24::int4[],
                $25::jsonb[], $26::text[], $27::text[], $28::int4[], $29::int4[], $30::int4[])
        AS t(id, token, stage, in_flight, new_status, outcome,
             attempt, started_at, analysis, context, answer,
             error_class, error_message, delay_ms, model, prompt_tokens,
             completion_tokens, latency_ms, chain_to, fused_in, fused_tokens, fused_latency_ms,
             context_sources, fused_answer, fused_model, fused_prompt_tokens,
             fused_completion_tokens, fused_respond_latency_ms)
    CROSS JOIN (SELECT EXISTS (SELECT 1 FROM maas_control WHERE paused) AS on) paused
),
done AS (
    UPDATE pipeline_runs r
    SET status                = CASE
                                    WHEN i.responds AND NOT r.debug THEN 'COMPLETED'
                                    WHEN i.chain IS NOT NULL AND NOT r.debug THEN i.chain
                                    WHEN i.fused AND NOT r.debug THEN 'READY'
                                    ELSE i.new_status END,
        analysis_result       = coalesce(i.analysis, r.analysis_result),
        final_context_payload = coalesce(CASE WHEN i.stage <> 'analyze' OR (i.fused AND NOT r.debug)
                                              THEN i.context END,
                                         r.final_context_payload),
        context_sources       = CASE WHEN i.context IS NOT NULL
                                      AND (i.stage <> 'analyze' OR (i.fused AND NOT r.debug))
                                     THEN i.context_sources
                                     ELSE r.context_sources END,
        final_answer          = coalesce(CASE WHEN i.responds AND NOT r.debug THEN i.fused_answer END,
                                         i.answer, r.final_answer),
        error                 = CASE i.outcome
                                    WHEN 'succeeded' THEN NULL
                                    WHEN 'released' THEN r.error
                                    ELSE left(i.error_message, 100000) END,
        attempt               = CASE
                                    WHEN i.chain IS NOT NULL AND NOT r.debug THEN 1
                                    WHEN i.outcome = 'succeeded' THEN 0
                                    WHEN i.outcome IN ('released', 'deferred') THEN greatest(r.attempt - 1, 0)
                                    ELSE r.attempt END,
        run_after             = now() + i.delay_ms * interval '1 millisecond',
        -- Debug mode: a debug request rests after each successful stage that
        -- leads to a dispatchable status, until an operator continues it.
        held                  = r.debug AND i.outcome = 'succeeded' AND i.new_status IN ('ANALYZED', 'READY'),
        lease_owner           = CASE WHEN i.chain IS NOT NULL AND NOT r.debug THEN $19 END,
        lease_expires_at      = CASE WHEN i.chain IS NOT NULL AND NOT r.debug
                                     THEN now() + make_interval(secs => $21) END,
        lease_token           = least(r.lease_token + CASE WHEN i.chain IS NOT NULL AND NOT r.debug THEN 1 ELSE 0 END,
                                      4611686018427387904),
        -- An answer that awaits review waits as long as its tenant's
        -- review_timeout (NULL: until reviewed or cancelled).
        wait_expires_at       = CASE WHEN i.outcome = 'succeeded' AND i.new_status = 'AWAITING_REVIEW'
                                     THEN now() + (SELECT t.review_timeout FROM tenants t WHERE t.id = r.tenant_id)
                                END,
        updated_at            = now()
    FROM input i
    WHERE r.id = ANY($1::uuid[])
      AND r.id = i.id AND r.lease_token = i.token AND r.status = i.in_flight AND r.lease_owner = i.owner
    RETURNING r.id, r.user_id, r.thread_id, r.status, r.user_query, r.attempt, r.lease_token,
              r.analysis_result, r.final_context_payload, r.debug, r.created_at, r.tenant_id, r.stream, r.review,
              i.token AS result_token, r.lease_owner IS NOT NULL AS chained, (i.fused AND NOT r.debug) AS fused,
              (i.responds AND NOT r.debug) AS responded, i.fused_answer, i.fused_model,
              i.fused_prompt_tokens, i.fused_completion_tokens, i.fused_respond_latency_ms,
              i.new_status, i.stage, i.attempt AS step_attempt, i.started_at, i.outcome, i.error_class,
              i.error_message, i.model, i.prompt_tokens, i.completion_tokens, i.latency_ms, i.answer,
              i.fused_tokens, i.fused_latency_ms
),
steps AS (
    INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome,
                                error_class, error_message, model, prompt_tokens,
                                completion_tokens, latency_ms)
    SELECT run_id, stage, attempt, $19, started_at, outcome, error_class, error_message, model,
           prompt_tokens, completion_tokens, latency_ms
    FROM (SELECT d.id AS run_id, 1 AS n, d.stage, d.step_attempt AS attempt, d.started_at, d.outcome,
                 d.error_class, d.error_message, d.model, d.prompt_tokens, d.completion_tokens, d.latency_ms
          FROM done d
          UNION ALL
          SELECT d.id, 2, 'assemble', 1, now(), 'succeeded', NULL, NULL, NULL, d.fused_tokens, NULL,
                 d.fused_latency_ms
          FROM done d
          WHERE d.fused
          UNION ALL
          SELECT d.id, 3, 'respond', 1, now(), 'succeeded', NULL, NULL, d.fused_model, d.fused_prompt_tokens,
                 d.fused_completion_tokens, d.fused_respond_latency_ms
          FROM done d
          WHERE d.responded) s
    ORDER BY run_id, n
),
-- The answers' logs, with what the raw_logs triggers would do per row done
-- per user (sql/0026_answer_logs_in_finish.sql): the forget guard, then the
-- user's sequence numbers from one upsert of archive_marks, then the logs
-- with their numbers (the triggers skip a log whose number is given).
answered AS MATERIALIZED (
    SELECT d.user_id, d.id, d.thread_id, CASE WHEN d.responded THEN d.fused_answer ELSE d.answer END AS answer,
           row_number() OVER (PARTITION BY d.user_id ORDER BY d.id) AS n,
           count(*) OVER (PARTITION BY d.user_id) AS answers
    FROM done d
    WHERE (d.responded OR (d.stage = 'respond' AND d.outcome = 'succeeded' AND d.answer IS NOT NULL))
      -- (an answer that awaits review is logged when it is approved:
      -- review_request.sql)
      AND d.status = 'COMPLETED'
      -- (a request's answer is logged once: no number is handed out twice)
      AND NOT EXISTS (SELECT 1 FROM raw_logs r
                      WHERE r.request_id = d.id AND r.message_type = 'assistant_response')
),
writable AS MATERIALIZED (
    -- In user order, as every statement takes these locks (the guard's
    -- volatile call is not pushed below the sort).
    SELECT u.user_id, u.answers
    FROM (SELECT DISTINCT a.user_id, a.answers FROM answered a ORDER BY a.user_id) u
    WHERE maas_user_writable(u.user_id, u.answers::int)
),
marks AS (
    -- Locks each user's mark until the commit, in user order, so that two
    -- daemons' batches cannot deadlock and a user's numbers commit in order.
    INSERT INTO archive_marks AS m (user_id, logged_seq, pending_since, last_active_at)
    SELECT w.user_id, w.answers, now(), now()
    FROM writable w
    ORDER BY w.user_id
    ON CONFLICT (user_id) DO UPDATE
        SET logged_seq     = m.logged_seq + EXCLUDED.logged_seq,
            pending_since  = coalesce(m.pending_since, EXCLUDED.pending_since),
            last_active_at = greatest(m.last_active_at, EXCLUDED.last_active_at)
    RETURNING m.user_id, m.logged_seq
),
-- Each user's last number, looked up by key: the planner takes every CTE
-- for one row, and a join of `answered` with `marks` was a nested loop that
-- read all of a batch's marks for each of its answers (128 × 128 rows for a
-- batch of 128). MATERIALIZED: inlined, the object was built again for
-- each answer.
numbers AS MATERIALIZED (
    SELECT jsonb_object_agg(k.user_id::text, k.logged_seq) AS last FROM marks k
),
logged AS (
    INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content, user_seq)
    SELECT a.user_id, a.id, a.thread_id, 'assistant_response', a.answer,
           (s.last ->> a.user_id::text)::int8 - a.answers + a.n
    FROM answered a
    CROSS JOIN numbers s
    WHERE s.last ? a.user_id::text
    ORDER BY a.user_id, a.n
    -- (only the conflict it means: a request's answer logged already;
    -- another, on a log's id or a user's number, is an error that fails
    -- this result with the constraint's name, never an answer not logged)
    ON CONFLICT (request_id, message_type) WHERE request_id IS NOT NULL DO NOTHING
),
passed AS (
    SELECT pg_notify('pipeline_events', maas_event(p.id, p.status, 'UPDATE', passed => true))
    FROM (SELECT d.id, s.status
          FROM done d
          CROSS JOIN LATERAL unnest(
              CASE WHEN d.fused THEN ARRAY['ANALYZED', 'ASSEMBLING'] ELSE ARRAY[]::text[] END
              || CASE WHEN d.responded THEN ARRAY['READY', 'RESPONDING']
                      WHEN d.chained THEN ARRAY[CASE WHEN d.fused THEN 'READY' ELSE d.new_status END]
                      ELSE ARRAY[]::text[] END) WITH ORDINALITY AS s(status, n)
          ORDER BY d.id, s.n) p
)
SELECT d.id, d.result_token, d.created_at, d.chained,
       d.user_id, d.thread_id, d.user_query, d.attempt, d.lease_token,
       CASE WHEN d.chained THEN d.analysis_result END AS analysis_result,
       CASE WHEN d.chained THEN d.final_context_payload END AS final_context_payload,
       d.debug, d.tenant_id, d.stream, now() AS claimed_at,
       -- The assembler's memory (sql/0007_assembler_memory.sql).
       CASE WHEN d.chained AND d.status = 'ASSEMBLING'
            THEN assembler_memory(d.user_id, d.analysis_result)
       END AS memory,
       d.status, d.fused, d.responded,
       -- Whether a row chained to the responder has its answer reviewed
       -- (as claim.sql reads it).
       CASE WHEN d.chained AND d.status = 'RESPONDING'
            THEN (d.review IS TRUE OR coalesce((SELECT t.hitl_review FROM tenants t WHERE t.id = d.tenant_id), false))
            ELSE false
       END AS review
FROM done d
-- The notifications are sent once: an uncorrelated subquery is an InitPlan
-- (run once, as a one-time filter). Joined instead, the count was the inner
-- side of a nested loop and read all of `passed` again for every row.
WHERE (SELECT count(*) FROM passed) >= 0
