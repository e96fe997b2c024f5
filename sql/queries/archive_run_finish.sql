-- Parameters, in the order `RunFinishParams` (src/repo/archive.rs) binds them (a unit test
-- compares the two lists):
-- $1  id
-- $2  users
-- $3  users_archived
-- $4  logs
-- $5  records
-- $6  failures
-- $7  errors
--
-- Closes the record of archive run $1 with its totals.
UPDATE archive_runs
SET finished_at    = now(),
    users          = $2,
    users_archived = $3,
    logs           = $4,
    records        = $5,
    failures       = $6,
    errors         = $7,
    duration_ms    = (extract(epoch FROM now() - started_at) * 1000)::bigint
WHERE id = $1
