-- The archivist: per-user high-water marks over raw_logs, and a record of
-- every archive run.
--
-- Why a per-user sequence and not raw_logs.id: identity values are handed
-- out when a row is inserted, but transactions commit in any order, so a log
-- with a lower id can become visible after one with a higher id. A mark over
-- ids would then skip it for ever. `user_seq` is handed out by the trigger in
-- triggers/0003_track_raw_logs.sql under the lock of the user's
-- archive_marks row, which is held until the inserting transaction ends: a
-- user's sequence numbers therefore commit in order (a rolled-back insert
-- rolls its number back too; an `ON CONFLICT DO NOTHING` that inserts
-- nothing leaves a harmless gap), and "every log with user_seq <= mark is
-- archived" is a sound high-water mark.

ALTER TABLE raw_logs ADD COLUMN user_seq bigint;
-- Existing logs are numbered per user in id order (all pending: nothing was
-- archived with marks before). On a large table this rewrites every row once.
UPDATE raw_logs r
SET user_seq = s.seq
FROM (SELECT id, row_number() OVER (PARTITION BY user_id ORDER BY id) AS seq FROM raw_logs) s
WHERE r.id = s.id;
ALTER TABLE raw_logs ALTER COLUMN user_seq SET NOT NULL;
-- Reading a user's pending logs: user_seq > mark, in order.
CREATE UNIQUE INDEX raw_logs_user_seq_idx ON raw_logs (user_id, user_seq);

-- One row per user who has ever logged anything. The trigger keeps
-- logged_seq, pending_since and last_active_at (one small UPSERT per log);
-- the archivist owns the rest.
CREATE TABLE archive_marks (
    user_id          uuid        PRIMARY KEY,
    -- The user's raw_logs sequence: the highest user_seq handed out.
    logged_seq       bigint      NOT NULL DEFAULT 0,
    -- The high-water mark: every log of this user with user_seq <= it is
    -- covered by exactly one lsm_storage row. Pending = logged_seq - archived_seq.
    archived_seq     bigint      NOT NULL DEFAULT 0,
    -- created_at of the oldest pending log; NULL when nothing is pending.
    pending_since    timestamptz,
    -- created_at of the newest log.
    last_active_at   timestamptz,
    last_archived_at timestamptz,
    -- Bumped by one for every new LSM record of the user, so clients can
    -- drop caches keyed by it (a cluster version).
    memory_version   bigint      NOT NULL DEFAULT 0,
    -- A runner working on this user holds a lease, so two runners do not
    -- both pay for the same model calls. Correctness does not rest on it:
    -- every commit is fenced on archived_seq.
    lease_owner      text,
    lease_expires_at timestamptz,
    -- Durable backoff after a failed attempt (the stages' policy).
    failures         integer     NOT NULL DEFAULT 0,
    retry_after      timestamptz,
    last_error       text,

    CONSTRAINT archive_marks_mark_valid CHECK (archived_seq >= 0 AND archived_seq <= logged_seq)
);
-- Candidate selection walks only users with something pending, oldest first.
CREATE INDEX archive_marks_pending_idx ON archive_marks (pending_since)
    WHERE archived_seq < logged_seq;

INSERT INTO archive_marks (user_id, logged_seq, pending_since, last_active_at)
SELECT user_id, max(user_seq), min(created_at), max(created_at)
FROM raw_logs
GROUP BY user_id;

-- Every archive run (a dry run changes nothing and leaves no row); a run
-- that crashed keeps finished_at NULL.
CREATE TABLE archive_runs (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trigger        text        NOT NULL,
    worker         text        NOT NULL,
    only_user      uuid,
    -- The cron tick a scheduled run belongs to (unique: one run per tick).
    tick           timestamptz,
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    -- Users selected, users archived, logs covered, records written,
    -- users that failed; errors holds {user_id, class, message} per failure.
    users          integer     NOT NULL DEFAULT 0,
    users_archived integer     NOT NULL DEFAULT 0,
    logs           bigint      NOT NULL DEFAULT 0,
    records        integer     NOT NULL DEFAULT 0,
    failures       integer     NOT NULL DEFAULT 0,
    errors         jsonb       NOT NULL DEFAULT '[]',
    duration_ms    bigint,

    CONSTRAINT archive_runs_trigger_valid CHECK (trigger IN ('cron', 'manual'))
);
CREATE INDEX archive_runs_started_idx ON archive_runs (started_at DESC);
CREATE UNIQUE INDEX archive_runs_tick_idx ON archive_runs (tick) WHERE tick IS NOT NULL;

-- The cron tick of the cluster: advanced only forward, so one tick runs on
-- one daemon however many there are.
CREATE TABLE archive_schedule (
    name      text        PRIMARY KEY,
    last_tick timestamptz NOT NULL
);
