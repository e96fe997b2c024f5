-- Gives up the run lease of schedule $1 if owner $2 still holds it.
UPDATE archive_schedule
SET run_owner = NULL, run_expires_at = NULL
WHERE name = $1 AND run_owner = $2
