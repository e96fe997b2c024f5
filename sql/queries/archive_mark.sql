-- One user's archive state, for maasctl and the status API.
SELECT user_id, logged_seq, archived_seq, logged_seq - archived_seq AS pending, pending_since,
       last_active_at, last_archived_at, memory_version, lease_owner, lease_expires_at,
       failures, retry_after, last_error
FROM archive_marks
WHERE user_id = $1
