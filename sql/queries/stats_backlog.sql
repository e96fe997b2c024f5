-- Unfinished runs by status: how many, how many are due now, how many rest
-- in debug mode, and how long the oldest due one has waited (seconds).
SELECT status,
       count(*)::int8,
       count(*) FILTER (WHERE status IN ('NEW', 'ANALYZED', 'READY') AND run_after <= now() AND NOT held)::int8,
       count(*) FILTER (WHERE held)::int8,
       extract(epoch FROM now() - min(greatest(updated_at, run_after))
           FILTER (WHERE status IN ('NEW', 'ANALYZED', 'READY') AND run_after <= now() AND NOT held))::float8
FROM pipeline_runs
WHERE status IN ('NEW', 'ANALYZING', 'ANALYZED', 'ASSEMBLING', 'READY', 'RESPONDING')
GROUP BY status
