-- Deletes turn $2 of user $1, takes its id out of the records that cover
-- it, bumps the memory version and records the action, in one statement.
-- A record's summary may still say what the turn said: replace or delete
-- the record too. A pending turn leaves a gap in user_seq, which the
-- archivist skips.
-- $1 user_id
-- $2 turn_id
-- $3 actor
-- $4 reason
WITH gone AS (
    DELETE FROM raw_logs WHERE user_id = $1 AND id = $2
    RETURNING id, request_id, message_type
),
stripped AS (
    UPDATE lsm_storage l SET raw_log_ids = array_remove(l.raw_log_ids, g.id)
    FROM gone g
    WHERE l.user_id = $1 AND l.raw_log_ids @> ARRAY[g.id]
    RETURNING l.id
),
bumped AS (
    UPDATE archive_marks m SET memory_version = m.memory_version + 1
    FROM gone g
    WHERE m.user_id = $1
    RETURNING m.memory_version
),
audit AS (
    INSERT INTO operator_actions (action, actor, reason, detail)
    SELECT 'memory_delete_turn', $3, $4,
           jsonb_build_object('user_id', $1::uuid::text, 'turn_id', g.id, 'request_id', g.request_id,
                              'message_type', g.message_type,
                              'records', (SELECT coalesce(jsonb_agg(s.id), '[]') FROM stripped s))
    FROM gone g
)
SELECT g.id, coalesce((SELECT b.memory_version FROM bumped b), 0) AS memory_version
FROM gone g
