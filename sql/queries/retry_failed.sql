-- Sends FAILED runs back to the ready status of the stage that failed, with
-- the attempts reset, on behalf of $3 for reason $4; each retry is recorded
-- in operator_actions with the error it clears. $1: the ids, or NULL for
-- every FAILED run; at most $2 rows per call (callers loop). A row locked
-- by a concurrent change is waited for and re-checked, so two operators
-- retrying at once retry it once.
-- The stage comes from the step history: the stage of the last step, or
-- the one after it when that step succeeded (a run failed by hand); with no
-- history, the first stage whose output is missing.
WITH target AS (
    SELECT r.id, r.error,
           coalesce(
               (SELECT CASE WHEN s.outcome = 'succeeded'
                            THEN CASE s.stage WHEN 'analyze' THEN 'assemble' ELSE 'respond' END
                            ELSE s.stage END
                FROM pipeline_steps s WHERE s.run_id = r.id ORDER BY s.id DESC LIMIT 1),
               CASE WHEN r.final_context_payload IS NOT NULL THEN 'respond'
                    WHEN r.analysis_result IS NOT NULL THEN 'assemble'
                    ELSE 'analyze' END) AS stage
    FROM pipeline_runs r
    WHERE r.status = 'FAILED' AND ($1::uuid[] IS NULL OR r.id = ANY($1::uuid[]))
    ORDER BY r.updated_at
    LIMIT $2
    FOR UPDATE OF r
),
moved AS (
    UPDATE pipeline_runs r
    SET status     = CASE t.stage WHEN 'analyze' THEN 'NEW' WHEN 'assemble' THEN 'ANALYZED' ELSE 'READY' END,
        attempt    = 0,
        run_after  = now(),
        error      = NULL,
        held       = false,
        updated_at = now()
    FROM target t
    WHERE r.id = t.id
    RETURNING r.id, r.status, t.stage, t.error
),
audit AS (
    INSERT INTO operator_actions (run_id, action, actor, reason, from_status, to_status, detail)
    SELECT id, 'retry', $3::text, $4::text, 'FAILED', status,
           jsonb_build_object('stage', stage, 'error', error)
    FROM moved
)
SELECT id, status, stage, error FROM moved
