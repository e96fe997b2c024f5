-- The request table and its step history.
--
-- A plain `INSERT INTO pipeline_runs (user_id, user_query) VALUES (...)` is
-- all another application needs: every other column has a default, and the
-- triggers in triggers/ ring `pipeline_events` and log the query.

CREATE TABLE pipeline_runs (
    id                    uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id               uuid        NOT NULL,
    thread_id             uuid,
    user_query            text        NOT NULL,
    status                text        NOT NULL DEFAULT 'NEW',
    analysis_result       jsonb,
    final_context_payload text,
    final_answer          text,
    error                 text,
    debug                 boolean     NOT NULL DEFAULT false,
    -- Attempts of the current stage; reset to 0 when a stage succeeds.
    attempt               integer     NOT NULL DEFAULT 0,
    -- Durable backoff: a dispatchable row is not claimed before this time.
    run_after             timestamptz NOT NULL DEFAULT now(),
    -- The lease of an in-flight stage: who holds it and until when.
    lease_owner           text,
    lease_expires_at      timestamptz,
    -- Fencing token: bumped on every claim and never reset, so a writer
    -- whose lease was lost cannot match the row again.
    lease_token           bigint      NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT pipeline_runs_status_valid CHECK (status IN (
        'NEW', 'ANALYZING', 'ANALYZED', 'ASSEMBLING', 'READY',
        'RESPONDING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    CONSTRAINT pipeline_runs_query_not_empty CHECK (btrim(user_query) <> ''),
    CONSTRAINT pipeline_runs_query_size CHECK (length(user_query) <= 100000),
    CONSTRAINT pipeline_runs_attempt_valid CHECK (attempt >= 0),
    -- In-flight rows always hold a lease; no other row does.
    CONSTRAINT pipeline_runs_lease_matches_status CHECK (
        (status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING'))
        = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- Claiming: the dispatchable rows of one status, oldest due first.
CREATE INDEX pipeline_runs_dispatch_idx ON pipeline_runs (status, run_after)
    WHERE status IN ('NEW', 'ANALYZED', 'READY');
-- The sweep: leases that may have run out.
CREATE INDEX pipeline_runs_lease_idx ON pipeline_runs (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX pipeline_runs_user_idx ON pipeline_runs (user_id, created_at);

-- One row per finished stage attempt (including attempts that were
-- interrupted: `lease_expired`, `released`, and attempts turned back before
-- any request was sent, `deferred`, which do not count). The attempt in flight is shown by
-- the lease columns of its run.
CREATE TABLE pipeline_steps (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id            uuid        NOT NULL REFERENCES pipeline_runs (id) ON DELETE CASCADE,
    stage             text        NOT NULL,
    attempt           integer     NOT NULL,
    worker            text        NOT NULL,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz NOT NULL DEFAULT now(),
    outcome           text        NOT NULL,
    error_class       text,
    error_message     text,
    model             text,
    prompt_tokens     integer,
    completion_tokens integer,
    latency_ms        integer,

    CONSTRAINT pipeline_steps_stage_valid CHECK (stage IN ('analyze', 'assemble', 'respond')),
    CONSTRAINT pipeline_steps_outcome_valid CHECK (outcome IN (
        'succeeded', 'failed', 'retrying', 'deferred', 'lease_expired', 'released'))
);
CREATE INDEX pipeline_steps_run_idx ON pipeline_steps (run_id, id);
