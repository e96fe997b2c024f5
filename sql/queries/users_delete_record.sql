-- Deletes record $2 of user $1 (another user's record is not found), bumps
-- the user's memory version and records the action, in one statement.
-- The audit detail names the record, never its text.
-- $1 user_id
-- $2 record_id
-- $3 actor
-- $4 reason
WITH gone AS (
    DELETE FROM lsm_storage WHERE user_id = $1 AND id = $2
    RETURNING id, cardinality(raw_log_ids) AS turns
),
bumped AS (
    UPDATE archive_marks m SET memory_version = m.memory_version + 1
    FROM gone g
    WHERE m.user_id = $1
    RETURNING m.memory_version
),
audit AS (
    INSERT INTO operator_actions (action, actor, reason, detail)
    SELECT 'memory_delete_record', $3, $4,
           jsonb_build_object('user_id', $1::uuid::text, 'record_id', g.id, 'turns', g.turns)
    FROM gone g
)
SELECT g.id, coalesce((SELECT b.memory_version FROM bumped b), 0) AS memory_version
FROM gone g
