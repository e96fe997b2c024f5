-- Records a failed attempt on user $1 by runner $2: error $3, retry not
-- before $4 milliseconds from now; $5 says whether it counts as a failure
-- (a local throttle does not). Gives up the lease.
UPDATE archive_marks
SET failures         = failures + CASE WHEN $5::bool THEN 1 ELSE 0 END,
    retry_after      = now() + $4::int8 * interval '1 millisecond',
    last_error       = $3::text,
    lease_owner      = NULL,
    lease_expires_at = NULL
WHERE user_id = $1 AND lease_owner = $2
RETURNING failures
