-- The last finished archive run (any daemon's, or maasctl's): when it
-- finished (unix seconds) and how many users failed in it. Reads
-- archive_runs_started_idx backwards.
SELECT extract(epoch FROM finished_at)::float8 AS finished_at,
       failures::int8 AS failures
FROM archive_runs
WHERE finished_at IS NOT NULL
ORDER BY started_at DESC
LIMIT 1
