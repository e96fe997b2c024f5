-- Claims up to $2 due rows of status $1 as leases held by $4 for $5 seconds,
-- moving them to the in-flight status $3. Rows locked by another claimer are
-- skipped, not waited for. Every claim counts an attempt and bumps the
-- fencing token. `due_for_ms` says how long each row had been waiting.
--
-- It also returns the memory the stage needs, always the requesting user's
-- own (invariant 7): for the analyzer ($1 = 'NEW') the user's $6 most recent
-- LSM records; for the assembler ($1 = 'ANALYZED') the record the analysis
-- refers to, only if it belongs to the same user.
WITH picked AS (
    SELECT id, greatest(updated_at, run_after) AS due_since
    FROM pipeline_runs
    WHERE status = $1 AND run_after <= now()
    ORDER BY run_after
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
claimed AS (
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
              r.analysis_result, r.final_context_payload, r.debug, now() AS claimed_at,
              (extract(epoch FROM (now() - picked.due_since)) * 1000)::float8 AS due_for_ms
)
SELECT c.id, c.user_id, c.thread_id, c.user_query, c.attempt, c.lease_token,
       c.analysis_result, c.final_context_payload, c.debug, c.claimed_at, c.due_for_ms,
       CASE
           WHEN $1 = 'NEW' THEN (
               SELECT jsonb_agg(to_jsonb(m) ORDER BY m.time_bucket_start DESC)
               FROM (SELECT l.id, l.time_bucket_start, l.time_bucket_end, l.tags, l.summary
                     FROM lsm_storage l
                     WHERE l.user_id = c.user_id
                     ORDER BY l.time_bucket_start DESC
                     LIMIT $6) m)
           WHEN $1 = 'ANALYZED' THEN (
               SELECT jsonb_agg(to_jsonb(m))
               FROM (SELECT l.id, l.time_bucket_start, l.time_bucket_end, l.tags, l.summary
                     FROM lsm_storage l
                     WHERE l.user_id = c.user_id
                       AND l.id = CASE
                                      WHEN (c.analysis_result #>> '{context_found,lsm_record_id}') ~ '^[0-9]{1,18}$'
                                      THEN (c.analysis_result #>> '{context_found,lsm_record_id}')::bigint
                                  END) m)
       END AS memory
FROM claimed c
