-- Leases user $1 to runner $2 for $3 seconds unless another runner holds a
-- live lease. Returns the mark and the user's sequence: every log with
-- archived_seq < user_seq <= logged_seq is committed (see
-- sql/0003_archivist.sql) and pending.
UPDATE archive_marks
SET lease_owner = $2,
    lease_expires_at = now() + make_interval(secs => $3)
WHERE user_id = $1
  AND (lease_expires_at IS NULL OR lease_expires_at < now() OR lease_owner = $2)
RETURNING archived_seq, logged_seq, failures, memory_version
