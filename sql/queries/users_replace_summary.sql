-- Replaces the summary of record $2 of user $1, bumps the memory version
-- and records the action, in one statement. The audit detail keeps the
-- lengths, not the texts.
-- $1 user_id
-- $2 record_id
-- $3 summary
-- $4 actor
-- $5 reason
WITH old AS (
    SELECT id, length(summary) AS old_chars FROM lsm_storage
    WHERE user_id = $1 AND id = $2
    FOR UPDATE
),
changed AS (
    UPDATE lsm_storage l SET summary = $3
    FROM old o
    WHERE l.id = o.id
    RETURNING l.id, o.old_chars
),
bumped AS (
    UPDATE archive_marks m SET memory_version = m.memory_version + 1
    FROM changed c
    WHERE m.user_id = $1
    RETURNING m.memory_version
),
audit AS (
    INSERT INTO operator_actions (action, actor, reason, detail)
    SELECT 'memory_replace_summary', $4, $5,
           jsonb_build_object('user_id', $1::uuid::text, 'record_id', c.id,
                              'old_chars', c.old_chars, 'new_chars', length($3))
    FROM changed c
)
SELECT c.id, coalesce((SELECT b.memory_version FROM bumped b), 0) AS memory_version
FROM changed c
