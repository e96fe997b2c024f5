-- Pauses ($1 = true) or resumes claiming in every daemon, on behalf of $3
-- for reason $2, and records the action. Returns whether it was paused before.
WITH before AS (
    SELECT paused AS was FROM maas_control
),
changed AS (
    INSERT INTO maas_control (singleton, paused, reason, changed_by, changed_at)
    VALUES (true, $1::bool, $2::text, $3::text, now())
    ON CONFLICT (singleton) DO UPDATE
    SET paused = EXCLUDED.paused, reason = EXCLUDED.reason,
        changed_by = EXCLUDED.changed_by, changed_at = EXCLUDED.changed_at
    RETURNING paused
),
audit AS (
    INSERT INTO operator_actions (action, actor, reason, detail)
    VALUES (CASE WHEN $1::bool THEN 'pause' ELSE 'resume' END, $3::text, $2::text,
            jsonb_build_object('was_paused', coalesce((SELECT was FROM before), false)))
)
SELECT coalesce((SELECT was FROM before), false) AS was_paused
