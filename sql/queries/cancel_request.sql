-- Cancels request $1 unless it is already terminal, on behalf of $2 (actor) for
-- reason $3, and records the action. An in-flight stage loses its lease here
-- (owner and expiry cleared, as pipeline_runs_lease_matches_status demands):
-- the daemon's heartbeat then cancels the stage, and a result that arrives
-- anyway is discarded by finish.sql's fence on status and owner. A waiting
-- request (WAITING_USER_INPUT, AWAITING_REVIEW) stops waiting: a reply or
-- a review that comes later finds it CANCELLED and is refused.
-- No row: unknown id. Otherwise the status before and whether it was cancelled.
WITH target AS (
    SELECT id, status, lease_owner, attempt
    FROM pipeline_runs
    WHERE id = $1
    FOR UPDATE
),
moved AS (
    UPDATE pipeline_runs r
    SET status           = 'CANCELLED',
        held             = false,
        lease_owner      = NULL,
        lease_expires_at = NULL,
        -- (a waiting request stops waiting: sql/0037_person_in_the_loop.sql)
        question         = NULL,
        wait_expires_at  = NULL,
        error            = 'cancelled by ' || $2::text || coalesce(': ' || $3::text, ''),
        updated_at       = now()
    FROM target t
    WHERE r.id = t.id AND t.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
    RETURNING r.id
),
audit AS (
    INSERT INTO operator_actions (run_id, action, actor, reason, from_status, to_status, detail)
    SELECT t.id, 'cancel', $2::text, $3::text, t.status, 'CANCELLED',
           jsonb_build_object('lease_owner', t.lease_owner, 'attempt', t.attempt)
    FROM target t JOIN moved m ON m.id = t.id
)
SELECT t.status, m.id IS NOT NULL AS cancelled
FROM target t LEFT JOIN moved m ON m.id = t.id
