-- The sweep's rescue: rows whose lease ran out go back to their ready status
-- with the attempt counted, or to FAILED once $1 attempts are spent. Each
-- interrupted attempt gets a `lease_expired` step row. At most $2 rows.
WITH expired AS (
    SELECT id, status, attempt, lease_owner, updated_at
    FROM pipeline_runs
    -- In flight exactly while leased (pipeline_runs_in_flight_idx).
    WHERE status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING') AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE pipeline_runs r
    SET status = CASE
                     WHEN e.attempt >= $1 THEN 'FAILED'
                     WHEN e.status = 'ANALYZING' THEN 'NEW'
                     WHEN e.status = 'ASSEMBLING' THEN 'ANALYZED'
                     ELSE 'READY' END,
        error = format('lease expired: worker %s stopped renewing it during %s (attempt %s of %s)',
                       e.lease_owner, e.status, e.attempt, $1),
        lease_owner = NULL,
        lease_expires_at = NULL,
        run_after = now(),
        updated_at = now()
    FROM expired e
    WHERE r.id = e.id
    RETURNING r.id, r.status AS new_status, e.status AS was, e.attempt, e.lease_owner, e.updated_at AS claimed_at
),
steps AS (
    INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome, error_class, error_message)
    SELECT id,
           CASE was WHEN 'ANALYZING' THEN 'analyze' WHEN 'ASSEMBLING' THEN 'assemble' ELSE 'respond' END,
           attempt, lease_owner, claimed_at, 'lease_expired', 'lease_expired',
           'the lease ran out before the stage finished'
    FROM moved
)
SELECT id, new_status, was FROM moved
