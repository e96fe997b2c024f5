-- Users never archived who crossed the novelty threshold ($1 logs
-- pending): their first archive run does not wait for the schedule's next
-- tick (every 6 hours by default), so a newcomer's records exist within
-- minutes. Not backing off after a failure, not leased by another runner.
-- At most $2, oldest pending first.
--
-- Reads archive_marks only, through its partial index on users with
-- something pending: never raw_logs, never the history.
SELECT user_id, logged_seq - archived_seq AS pending
FROM archive_marks
WHERE pending_since IS NOT NULL AND archived_seq < logged_seq
  AND last_archived_at IS NULL
  AND logged_seq - archived_seq >= $1
  AND (retry_after IS NULL OR retry_after <= now())
  AND (lease_expires_at IS NULL OR lease_expires_at < now())
ORDER BY pending_since
LIMIT $2
