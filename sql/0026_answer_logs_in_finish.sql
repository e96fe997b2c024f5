-- The answer's log written by the statement that records the answer, with
-- no trigger call per row.
--
-- Every raw_logs insert ran two PL/pgSQL trigger functions per row, each
-- with its own executor start, SPI statement and search_path switch: the
-- forget guard (drop_forgotten_write, sql/0010_user_data.sql) and the
-- novelty count (track_raw_log, triggers/0004_track_raw_logs.sql). For the
-- answer logged by finish.sql they were most of the statement's cost
-- (`bin/bench --only=throughput` reports PostgreSQL's CPU per request;
-- BENCHMARKS.md, "Fewer writes per request"). finish.sql now does both set
-- by set: per user of the batch, in user order, the guard below; then one
-- upsert of archive_marks that hands out the users' sequence numbers; then
-- the logs with those numbers. The triggers skip a row whose user_seq is
-- given by a role that may update raw_logs (the daemon); for any other
-- insert (a producer's, a request's query logged by log_user_query) they run
-- as before and overwrite whatever user_seq was given.

-- The forget guard of one user's writes: waits for an erase of the user's
-- bucket in progress (the shared lock of maas_user_erase_key), then, if the
-- user was forgotten, counts `writes` dropped writes and returns false.
-- Volatile: its UPDATE reads with a snapshot taken after the lock, so a
-- tombstone committed while it waited is seen, as the trigger's check sees
-- it. PL/pgSQL, not SQL: a session keeps its statement's plan, where an
-- SQL function's body would be planned again by every statement calling
-- it (a single-row finish paid that on every answer).
CREATE FUNCTION maas_user_writable(u uuid, writes int) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(maas_user_erase_key(u));
    UPDATE forgotten_users SET dropped_writes = dropped_writes + writes WHERE user_id = u;
    RETURN NOT FOUND;
END
$$;

DROP TRIGGER raw_logs_forgotten_guard ON raw_logs;
CREATE TRIGGER raw_logs_forgotten_guard
    BEFORE INSERT ON raw_logs
    FOR EACH ROW
    WHEN (NEW.user_seq IS NULL OR NOT has_table_privilege('raw_logs'::regclass, 'UPDATE'))
    EXECUTE FUNCTION drop_forgotten_write();
