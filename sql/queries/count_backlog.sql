-- Requests by non-terminal status, plus the failed ones, each part served by
-- a partial index: dispatchable rows (pipeline_runs_dispatch_idx), leased
-- rows (pipeline_runs_in_flight_idx), failed rows (pipeline_runs_failed_idx).
SELECT status, count(*)::int8 AS n FROM pipeline_runs
WHERE status IN ('NEW', 'ANALYZED', 'READY') GROUP BY status
UNION ALL
SELECT status, count(*)::int8 FROM pipeline_runs
WHERE status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING') GROUP BY status
UNION ALL
SELECT 'FAILED', count(*)::int8 FROM pipeline_runs
WHERE status = 'FAILED'
