-- Deletes up to $2 records whose period ended more than $1 seconds ago,
-- skipping locked rows, and bumps the memory version of each user that
-- lost one (marks locked in user order).
WITH victims AS (
    SELECT id FROM lsm_storage
    WHERE time_bucket_end < now() - make_interval(secs => $1)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM lsm_storage l USING victims v WHERE l.id = v.id RETURNING l.user_id
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
