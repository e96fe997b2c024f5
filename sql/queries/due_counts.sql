-- Dispatchable rows that are due now, by status, and since when the oldest waits.
SELECT status, count(*)::int8 AS due,
       extract(epoch FROM now() - min(greatest(updated_at, run_after)))::float8 AS oldest_due_secs
FROM pipeline_runs
WHERE status IN ('NEW', 'ANALYZED', 'READY') AND run_after <= now() AND NOT held
GROUP BY status
