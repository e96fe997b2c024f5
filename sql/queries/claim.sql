-- Claims up to $2 due rows of status $1 as leases held by $4 for $5 seconds,
-- moving them to the in-flight status $3. Rows locked by another claimer are
-- skipped, not waited for. Every claim counts an attempt and bumps the
-- fencing token. `due_for_ms` says how long each row had been waiting.
-- Debug runs resting for `maasctl requests continue` (`held`) are skipped;
-- while `maasctl pause` is in force nothing is claimed (one-row table, read
-- once per statement as a one-time filter).
WITH picked AS (
    SELECT id, greatest(updated_at, run_after) AS due_since
    FROM pipeline_runs
    WHERE status = $1 AND run_after <= now() AND NOT held
      AND NOT EXISTS (SELECT 1 FROM maas_control WHERE paused)
    ORDER BY run_after
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE pipeline_runs r
SET status           = $3,
    attempt          = r.attempt + 1,
    lease_owner      = $4,
    lease_expires_at = now() + make_interval(secs => $5),
    lease_token      = r.lease_token + 1,
    updated_at       = now()
FROM picked
WHERE r.id = picked.id
RETURNING r.id, r.user_id, r.thread_id, r.user_query, r.attempt, r.lease_token,
          r.analysis_result, r.final_context_payload, r.debug,
          now() AS claimed_at,
          (extract(epoch FROM (now() - picked.due_since)) * 1000)::float8 AS due_for_ms
