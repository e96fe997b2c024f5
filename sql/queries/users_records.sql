-- A page of user $1's records, newest first, by keyset on id.
-- $1 user_id
-- $2 before: only records with a smaller id (NULL: from the newest)
-- $3 limit
SELECT id, time_bucket_start, time_bucket_end, tags, summary,
       cardinality(raw_log_ids)::bigint AS turns, created_at
FROM lsm_storage
WHERE user_id = $1 AND ($2::bigint IS NULL OR id < $2)
ORDER BY id DESC
LIMIT $3
