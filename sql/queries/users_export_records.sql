-- A page of user $1's records for the export, oldest first, after id $2;
-- $3 rows at most.
SELECT id, time_bucket_start, time_bucket_end, tags, summary, raw_log_ids, created_at
FROM lsm_storage
WHERE user_id = $1 AND id > $2
ORDER BY id
LIMIT $3
