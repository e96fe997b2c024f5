-- A user's data: corrections recorded in the audit trail, and forgetting a
-- user (the right to erasure) with a tombstone that refuses late writes.
--
-- Forgetting (src/users.rs): the eraser first commits a tombstone row while
-- holding the user's erase lock exclusively, then deletes the user's rows in
-- bounded batches and finally sets finished_at. Every insert of a user's
-- request, turn or record takes the same lock shared (the guard triggers
-- below) and then looks for a tombstone with a fresh snapshot, so:
-- - a writer that got past the guard before the tombstone has committed
--   before the tombstone does (the eraser waited for its lock), and its
--   rows are deleted by the batches that follow;
-- - a writer after the tombstone sees it: a request is refused (SQLSTATE
--   MA410), a turn or record is dropped (the daemon's and the archivist's
--   batches of many users must not fail for one forgotten user) and counted
--   in forgotten_users.dropped_writes.
-- The lock is one of 64 buckets of user ids, so one statement writing for
-- many users takes at most 64 lock slots; forgetting a user waits for the
-- writers of its bucket only.

CREATE TABLE forgotten_users (
    user_id        uuid        PRIMARY KEY,
    requested_at   timestamptz NOT NULL DEFAULT now(),
    -- NULL while the erase runs (the API answers 409 to another erase).
    finished_at    timestamptz,
    actor          text        NOT NULL,
    reason         text,
    -- What the erase deleted: {requests, turns, records, ...}.
    erased         jsonb       NOT NULL DEFAULT '{}',
    -- Writes for the user that arrived after the tombstone and were dropped.
    dropped_writes bigint      NOT NULL DEFAULT 0
);
CREATE INDEX forgotten_users_running_idx ON forgotten_users (requested_at) WHERE finished_at IS NULL;

-- The advisory lock key of a user's erase bucket ("mu" and a bucket 0..63).
CREATE FUNCTION maas_user_erase_key(u uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (x'6d75'::bigint << 32) | (hashtext(u::text) & 63)::bigint
$$;

-- Requests for a forgotten user are refused.
CREATE FUNCTION refuse_forgotten_request() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(maas_user_erase_key(NEW.user_id));
    IF EXISTS (SELECT 1 FROM forgotten_users WHERE user_id = NEW.user_id) THEN
        RAISE EXCEPTION 'user % was forgotten; requests for this user are refused', NEW.user_id
            USING ERRCODE = 'MA410', COLUMN = 'user_id',
                  HINT = 'delete the user''s row of forgotten_users to accept this user id again';
    END IF;
    RETURN NEW;
END
$$;

-- Turns and records of a forgotten user are dropped and counted.
CREATE FUNCTION drop_forgotten_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(maas_user_erase_key(NEW.user_id));
    UPDATE forgotten_users SET dropped_writes = dropped_writes + 1 WHERE user_id = NEW.user_id;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

-- Trigger names: BEFORE triggers fire in name order, and these must fire
-- before raw_logs_track (which would create the user's archive mark).
CREATE TRIGGER pipeline_runs_forgotten_guard
    BEFORE INSERT ON pipeline_runs
    FOR EACH ROW EXECUTE FUNCTION refuse_forgotten_request();
CREATE TRIGGER raw_logs_forgotten_guard
    BEFORE INSERT ON raw_logs
    FOR EACH ROW EXECUTE FUNCTION drop_forgotten_write();
CREATE TRIGGER lsm_storage_forgotten_guard
    BEFORE INSERT ON lsm_storage
    FOR EACH ROW EXECUTE FUNCTION drop_forgotten_write();

-- Memory corrections in the audit trail. The allowed actions are extended,
-- not restated, so actions added by other migrations stay allowed.
DO $$
DECLARE
    def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def
    FROM pg_constraint
    WHERE conname = 'operator_actions_action_valid' AND conrelid = 'operator_actions'::regclass;
    IF def IS NOT NULL AND position('memory_delete_record' IN def) = 0 THEN
        EXECUTE 'ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_valid';
        EXECUTE 'ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_valid '
            || replace(def, 'ARRAY[',
                       'ARRAY[''memory_delete_record''::text, ''memory_delete_turn''::text, '
                       || '''memory_replace_summary''::text, ');
    END IF;
END
$$;

-- A user's corrections (detail->>'user_id'), for the user's view and the erase.
CREATE INDEX operator_actions_user_idx ON operator_actions ((detail ->> 'user_id'))
    WHERE detail ? 'user_id';
-- Memory listing newest first, by keyset on id.
CREATE INDEX lsm_storage_user_id_idx ON lsm_storage (user_id, id DESC);

-- Memory retention (retention.logs_keep_days, retention.memory_keep_days;
-- off by default): turns by age, records by the end of their period. BRIN
-- for raw_logs: its rows arrive in time order, the index is a few pages and
-- costs the insert path next to nothing.
CREATE INDEX raw_logs_created_brin ON raw_logs USING brin (created_at);
CREATE INDEX lsm_storage_end_idx ON lsm_storage (time_bucket_end);
