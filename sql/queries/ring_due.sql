-- Rings the doorbell once per status that has due rows, naming its oldest
-- row, so every listening daemon claims them.
SELECT pg_notify('pipeline_events', maas_event(id, status, 'SWEEP'))
FROM (
    SELECT DISTINCT ON (status) id, status
    FROM pipeline_runs
    WHERE status IN ('NEW', 'ANALYZED', 'READY') AND run_after <= now() AND NOT held
    ORDER BY status, run_after
) oldest
