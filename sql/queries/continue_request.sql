-- Debug mode: releases request $1 if it rests (`held`) in ANALYZED or READY, on
-- behalf of $2 for reason $3, records the action and rings the doorbell
-- (the status does not change, so the notify trigger stays silent).
-- No row: unknown id. Otherwise its status, debug flag, and whether it was released.
WITH target AS (
    SELECT id, status, debug, held
    FROM pipeline_runs
    WHERE id = $1
    FOR UPDATE
),
released AS (
    UPDATE pipeline_runs r
    SET held = false, run_after = now(), updated_at = now()
    FROM target t
    WHERE r.id = t.id AND t.held
    RETURNING r.id, r.status
),
audit AS (
    INSERT INTO operator_actions (run_id, action, actor, reason, from_status, to_status)
    SELECT id, 'continue', $2::text, $3::text, status, status FROM released
),
rung AS (
    SELECT count(*) AS n
    FROM released, LATERAL (SELECT pg_notify('pipeline_events',
        maas_event(released.id, released.status, 'CONTINUE'))) x
)
SELECT t.status, t.debug, (SELECT n FROM rung) > 0 AS released
FROM target t
