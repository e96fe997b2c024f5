-- Deletes up to $2 records of user $1.
WITH gone AS (
    DELETE FROM lsm_storage WHERE id IN (
        SELECT id FROM lsm_storage WHERE user_id = $1 ORDER BY id LIMIT $2)
    RETURNING id
)
SELECT count(*) AS deleted FROM gone
