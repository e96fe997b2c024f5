-- The archivist's one write for a batch of user $1: advances the mark from
-- $2 to $3 and inserts the records $4 (a JSON array of {time_bucket_start,
-- time_bucket_end, tags, summary, raw_log_ids}) in one statement, hence one
-- transaction. Fenced: nothing happens unless the mark is still $2, so two
-- runners can never both archive the same logs (the loser gets no row).
-- The memory version goes up by one per record.
WITH fenced AS (
    UPDATE archive_marks m
    SET archived_seq     = $3,
        memory_version   = m.memory_version + jsonb_array_length($4),
        last_archived_at = now(),
        pending_since    = CASE WHEN m.logged_seq > $3 THEN coalesce(
                               (SELECT l.created_at FROM raw_logs l
                                WHERE l.user_id = $1 AND l.user_seq > $3
                                ORDER BY l.user_seq LIMIT 1), now()) END,
        failures         = 0,
        retry_after      = NULL,
        last_error       = NULL
    WHERE m.user_id = $1 AND m.archived_seq = $2
    RETURNING m.user_id, m.memory_version
),
inserted AS (
    INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary, raw_log_ids)
    SELECT f.user_id, r.time_bucket_start, r.time_bucket_end, r.tags, r.summary, r.raw_log_ids
    FROM fenced f,
         ROWS FROM (jsonb_to_recordset($4)
                        AS (time_bucket_start timestamptz, time_bucket_end timestamptz, tags text[],
                            summary text, raw_log_ids bigint[])) WITH ORDINALITY
             AS r(time_bucket_start, time_bucket_end, tags, summary, raw_log_ids, n)
    ORDER BY r.n
    RETURNING id
)
SELECT f.memory_version, (SELECT count(*) FROM inserted) AS records
FROM fenced f
