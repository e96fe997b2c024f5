-- What is held about user $1 at a glance: the archive mark, whether any
-- request or record exists, and the tombstone if the user was forgotten.
-- One row always (NULLs where nothing is held).
SELECT $1::uuid AS user_id,
       m.logged_seq, m.archived_seq, m.memory_version, m.pending_since, m.last_archived_at,
       EXISTS (SELECT 1 FROM pipeline_runs r WHERE r.user_id = $1) AS has_requests,
       EXISTS (SELECT 1 FROM lsm_storage l WHERE l.user_id = $1) AS has_records,
       f.requested_at AS forgotten_at, f.finished_at AS erase_finished_at,
       f.actor AS forgotten_by, f.reason AS forgotten_reason
FROM (SELECT) AS one
LEFT JOIN archive_marks m ON m.user_id = $1
LEFT JOIN forgotten_users f ON f.user_id = $1
