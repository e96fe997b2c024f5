-- Deletes up to $2 turns older than $1 seconds, skipping locked rows, and
-- bumps the memory version of each user that lost one (marks locked in
-- user order, so concurrent passes cannot deadlock on them). A pending turn
-- leaves a gap in user_seq, which the archivist skips. Records keep the ids
-- of the turns they were made from.
WITH victims AS (
    SELECT id FROM raw_logs
    WHERE created_at < now() - make_interval(secs => $1)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM raw_logs r USING victims v WHERE r.id = v.id RETURNING r.user_id
),
marks AS (
    SELECT m.user_id FROM archive_marks m
    WHERE m.user_id IN (SELECT DISTINCT g.user_id FROM gone g)
    ORDER BY m.user_id
    FOR UPDATE
),
bumped AS (
    UPDATE archive_marks m SET memory_version = m.memory_version + 1
    FROM marks k WHERE m.user_id = k.user_id
)
SELECT count(*) AS deleted FROM gone
