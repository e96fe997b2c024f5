-- Operating maas: pause/resume, debug holds, operator audit, callbacks,
-- retention, and autovacuum settings for the hot tables.

-- Pause/resume for every daemon at once. One row, read by the claim
-- statement itself (an uncorrelated sub-select, evaluated once per claim as a
-- one-time filter on a one-page table), so `maasctl pause` stops claiming in
-- every daemon at its next claim, with no restart and no cache to go stale.
CREATE TABLE maas_control (
    singleton  boolean     PRIMARY KEY DEFAULT true,
    paused     boolean     NOT NULL DEFAULT false,
    reason     text,
    changed_by text,
    changed_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT maas_control_one_row CHECK (singleton)
);
INSERT INTO maas_control DEFAULT VALUES;

-- Debug mode: a request with `debug = true` rests in ANALYZED and in
-- READY with `held = true` after each successful stage (finish.sql sets it);
-- the claim skips held rows until `maasctl requests continue` (or
-- `maas::control::continue_request`) clears the flag and rings the doorbell.
-- Retries, expired leases and shutdown releases never set it.
ALTER TABLE pipeline_runs ADD COLUMN held boolean NOT NULL DEFAULT false;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_held_valid
    CHECK (NOT held OR (debug AND status IN ('ANALYZED', 'READY')));

-- Callbacks (the user's notification): an optional URL POSTed when the
-- request becomes COMPLETED, FAILED or CANCELLED, through callback_outbox.
ALTER TABLE pipeline_runs ADD COLUMN callback_url text;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_callback_url_valid
    CHECK (callback_url IS NULL OR (callback_url ~ '^https?://[^[:space:]]+$' AND length(callback_url) <= 2048));

-- Retention and `requests list`/`stats` over finished runs: terminal rows by
-- the time they finished. Partial, so only terminal transitions pay for it.
CREATE INDEX pipeline_runs_finished_idx ON pipeline_runs (updated_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- Every operator action (retry, cancel, continue, pause, resume, prompt
-- changes) with who, why, and what it changed. Stage attempts stay in
-- pipeline_steps; this is the operator's side of the audit trail.
CREATE TABLE operator_actions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      uuid        REFERENCES pipeline_runs (id) ON DELETE CASCADE,
    action      text        NOT NULL,
    actor       text        NOT NULL,
    reason      text,
    from_status text,
    to_status   text,
    detail      jsonb,
    at          timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT operator_actions_action_valid CHECK (action IN (
        'retry', 'cancel', 'continue', 'pause', 'resume', 'prompt_set', 'prompt_activate'))
);
CREATE INDEX operator_actions_run_idx ON operator_actions (run_id, id) WHERE run_id IS NOT NULL;
CREATE INDEX operator_actions_at_idx ON operator_actions (at) WHERE run_id IS NULL;

-- The durable outbox of callback deliveries. A trigger
-- (triggers/0003_callback_outbox.sql) adds a row in the same transaction as
-- the terminal transition, whoever makes it (the daemon, maasctl, psql).
-- Delivery workers in maasd claim due rows with SKIP LOCKED; a claim pushes
-- next_attempt_at forward as a lease, so a crashed delivery is retried.
CREATE TABLE callback_outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id          uuid        NOT NULL REFERENCES pipeline_runs (id) ON DELETE CASCADE,
    url             text        NOT NULL,
    event           text        NOT NULL,
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_status     integer,
    last_error      text,
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT callback_outbox_state_valid CHECK (state IN ('pending', 'delivered', 'dead'))
);
CREATE INDEX callback_outbox_due_idx ON callback_outbox (next_attempt_at) WHERE state = 'pending';
CREATE INDEX callback_outbox_dead_idx ON callback_outbox (created_at) WHERE state = 'dead';
CREATE INDEX callback_outbox_run_idx ON callback_outbox (run_id);

-- Autovacuum for the hot tables. pipeline_runs is updated several times per
-- request (claim, heartbeat, finish per stage): vacuum and analyze after 2 %
-- and 1 % of it changed instead of 20 % and 10 %, and let vacuum work faster,
-- so dead tuples do not bloat the dispatch index the claim scans.
-- pipeline_steps and raw_logs are insert-mostly: vacuum after 5 % new rows so
-- the visibility map stays current. The outbox is small and churns: vacuum
-- it after a fixed number of dead rows.
ALTER TABLE pipeline_runs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_vacuum_cost_limit = 2000,
    fillfactor = 90
);
ALTER TABLE pipeline_steps SET (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
ALTER TABLE raw_logs SET (autovacuum_vacuum_insert_scale_factor = 0.05);
ALTER TABLE callback_outbox SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000
);
