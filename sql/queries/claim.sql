-- Claims up to $1 due rows of status {ready} as leases held by $2 for $3
-- seconds, moving them to the in-flight status {in_flight}. Rows locked by
-- another claimer are skipped, not waited for. Every claim counts an attempt
-- and bumps the fencing token. `due_for_ms` says how long each row waited.
--
-- {ready} and {in_flight} are replaced by literals, one statement per stage,
-- so that the generic plan of the prepared statement can use the partial
-- index on dispatchable statuses (with a parameter it cannot, and every
-- execution would be planned anew).
--
-- Debug runs resting for `maasctl requests continue` (`held`) are skipped;
-- while `maasctl pause` is in force nothing is claimed (one-row table, read
-- once per statement as a one-time filter). `finish.sql` claims the same way
-- when it chains a finished row into its next stage.
--
-- The claim commits without waiting for its WAL flush (synchronous_commit
-- off for this transaction only, set by `lazy_commit` below). A claim is
-- only a lease, and nothing is lost if a database crash forgets it: the row
-- is due again, as if it had never been claimed. Everything the daemon then
-- writes about the row is fenced on the lease and commits durably, and a
-- durable commit flushes the WAL written before it, this claim included, so
-- no result ever stands on a forgotten claim. The fencing token is what
-- makes that hold: it is taken from the clock as well as bumped, so the
-- claim made after a crash never repeats a token the forgotten one gave out,
-- even to the same daemon (whose stale result is then rejected). Waiting for
-- the flush cost a claim about a third of its latency.
--
-- `tenant_id` names whose LLM tokens the stage spends (the per-tenant
-- token metric, sql/0012_tenants.sql).
--
-- `review`: whether the request's answer waits for an operator's review:
-- when the request asks for it (`review` true) or its tenant requires it
-- (`hitl_review`, one primary-key read; a request cannot opt out of its
-- tenant's review), for the stages that may
-- answer: the responder ({ready} = 'READY') and the analyzer, whose task
-- may run the respond stage right after it ({ready} = 'NEW'). The
-- assembler's claim says false without reading it.
--
-- It also returns the memory the stage needs, always the requesting user's
-- own (invariant 7): for the analyzer ({ready} = 'NEW') the user's $4 most
-- recent LSM records; for the assembler ({ready} = 'ANALYZED') the record the
-- analysis refers to, only if it belongs to the same user (assembler_memory,
-- sql/0007_assembler_memory.sql). For the analyzer it also returns
-- `earlier_turns`: how many turns the user logged besides this request's
-- query (the archive mark's sequence, one primary-key read; the query was
-- logged when the request was inserted), so that a newcomer's analysis can
-- ask for the search over turns before any archive run. And `clarify`,
-- for the analyzer only: whether it may ask the user (the request's flag,
-- else its tenant's `hitl_clarify`; one primary-key read of `tenants`),
-- and where it may, `exchange`: the question it asked already and the
-- reply, from this request's turns (sql/0037_person_in_the_loop.sql).
-- For the other stages both lookups fold away with the literal {ready}.
WITH picked AS (
    SELECT id, ctid AS at, greatest(updated_at, run_after) AS due_since
    FROM pipeline_runs
    WHERE status = {ready} AND run_after <= now() AND NOT held
      AND NOT EXISTS (SELECT 1 FROM maas_control WHERE paused)
    ORDER BY run_after
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE pipeline_runs r
    SET status           = {in_flight},
        -- Saturates at the bound of pipeline_runs_attempt_range (0009): a
        -- request inserted at the bound is still claimed, not an error that
        -- fails the whole claim.
        attempt          = least(r.attempt + 1, 1000),
        lease_owner      = $2,
        lease_expires_at = now() + make_interval(secs => $3),
        lease_token      = least(greatest(r.lease_token + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::int8),
                                 4611686018427387904),
        updated_at       = now()
    FROM picked
    -- By the row version just locked, not by id: a TID scan per row,
    -- whatever the statistics say. Joined by id, the planner took a hash
    -- join over a sequential scan of the whole table whenever 128 index
    -- probes looked dearer than reading it (tables up to some 30,000 rows
    -- for a batch of 128, ten times that for a batch of 1,024). The row is
    -- locked, so its version cannot move before the update; `id` is checked
    -- as well. A row changed by another transaction after this statement
    -- began is locked in its newer version, which the update cannot see: it
    -- is left as it is, for the next claim.
    WHERE r.ctid = picked.at AND r.id = picked.id
    RETURNING r.id, r.user_id, r.thread_id, r.user_query, r.attempt, r.lease_token,
              r.analysis_result, r.final_context_payload, r.debug, r.tenant_id, r.stream, r.clarify, r.review,
              now() AS claimed_at, (extract(epoch FROM (now() - picked.due_since)) * 1000)::float8 AS due_for_ms
)
SELECT c.id, c.user_id, c.thread_id, c.user_query, c.attempt, c.lease_token,
       c.analysis_result, c.final_context_payload, c.debug, c.tenant_id, c.stream, c.claimed_at, c.due_for_ms,
       CASE
           WHEN {ready} IN ('NEW', 'READY') THEN (c.review IS TRUE OR coalesce(k.hitl_review, false))
           ELSE false
       END AS review,
       CASE
           WHEN {ready} = 'NEW' THEN (
               SELECT jsonb_agg(to_jsonb(m) ORDER BY m.time_bucket_start DESC)
               FROM (SELECT l.id, l.time_bucket_start, l.time_bucket_end, l.tags, l.summary
                     FROM lsm_storage l
                     WHERE l.user_id = c.user_id
                     ORDER BY l.time_bucket_start DESC
                     LIMIT $4) m)
           WHEN {ready} = 'ANALYZED' THEN assembler_memory(c.user_id, c.analysis_result)
       END AS memory,
       CASE
           WHEN {ready} = 'NEW' THEN (
               SELECT greatest(m.logged_seq - 1, 0) FROM archive_marks m WHERE m.user_id = c.user_id)
       END AS earlier_turns,
       k.clarify,
       CASE
           WHEN k.clarify THEN (
               SELECT jsonb_object_agg(l.message_type, l.content)
               FROM raw_logs l
               WHERE l.request_id = c.id AND l.message_type IN ('assistant_question', 'user_reply'))
       END AS exchange
FROM claimed c
-- (one primary-key read of the request's tenant, for the analyze and
-- respond claims only: whether it may ask, whether its answer awaits review)
LEFT JOIN LATERAL (
    SELECT CASE WHEN {ready} = 'NEW' THEN coalesce(c.clarify, t.hitl_clarify) END AS clarify, t.hitl_review
    FROM tenants t
    WHERE {ready} IN ('NEW', 'READY') AND t.id = c.tenant_id
) k ON true
CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit
