-- Gives up runner $2's lease on user $1.
UPDATE archive_marks
SET lease_owner = NULL, lease_expires_at = NULL
WHERE user_id = $1 AND lease_owner = $2
