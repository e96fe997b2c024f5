-- Renews runner $2's lease on user $1 for $3 seconds; no row when it was lost.
UPDATE archive_marks
SET lease_expires_at = now() + make_interval(secs => $3)
WHERE user_id = $1 AND lease_owner = $2
RETURNING user_id
