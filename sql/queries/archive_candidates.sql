-- Users due for archiving (novelty, age and activity): something pending, active within $3
-- seconds, and either at least $1 logs pending or the oldest pending log
-- older than $2 seconds; not archived within the cooldown ($4 seconds), not
-- backing off after a failure, not leased by another runner. At most $5,
-- oldest pending first.
--
-- Reads archive_marks only, through its partial index on users with
-- something pending: never raw_logs, never the history.
SELECT user_id, logged_seq - archived_seq AS pending
FROM archive_marks
WHERE pending_since IS NOT NULL AND archived_seq < logged_seq
  AND last_active_at >= now() - make_interval(secs => $3)
  AND (logged_seq - archived_seq >= $1 OR pending_since <= now() - make_interval(secs => $2))
  AND (last_archived_at IS NULL OR last_archived_at <= now() - make_interval(secs => $4))
  AND (retry_after IS NULL OR retry_after <= now())
  AND (lease_expires_at IS NULL OR lease_expires_at < now())
ORDER BY pending_since
LIMIT $5
