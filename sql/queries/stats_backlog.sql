-- Unfinished runs by status: how many, how many are due now, how many rest
-- in debug mode, and how long the oldest due one has waited (seconds).
-- Two halves whose predicates match the partial dispatch and in-flight indexes,
-- so a table full of finished runs is not scanned.
SELECT status,
       count(*)::int8 AS total,
       count(*) FILTER (WHERE run_after <= now() AND NOT held)::int8 AS due,
       count(*) FILTER (WHERE held)::int8 AS held,
       extract(epoch FROM now() - min(greatest(updated_at, run_after))
           FILTER (WHERE run_after <= now() AND NOT held))::float8 AS oldest_due_secs
FROM pipeline_runs
WHERE status IN ('NEW', 'ANALYZED', 'READY')
GROUP BY status
UNION ALL
SELECT status, count(*)::int8, 0::int8, 0::int8, NULL::float8
FROM pipeline_runs
WHERE status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING')
GROUP BY status
