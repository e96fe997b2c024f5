-- Novelty counting for the archivist: every raw_logs insert bumps
-- its user's sequence in archive_marks and takes the number as user_seq.
--
-- Cost on the fast path: one small UPSERT per log, by primary key. The
-- user's archive_marks row stays locked until the inserting transaction
-- ends, so concurrent inserts of ONE user serialise (that is what makes the
-- sequence commit in order, see sql/0003_archivist.sql); different users do
-- not touch each other. A statement that logs for several users locks their
-- rows in row order.
CREATE OR REPLACE FUNCTION track_raw_log() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO archive_marks AS m (user_id, logged_seq, pending_since, last_active_at)
    VALUES (NEW.user_id, 1, NEW.created_at, NEW.created_at)
    ON CONFLICT (user_id) DO UPDATE
        SET logged_seq     = m.logged_seq + 1,
            pending_since  = coalesce(m.pending_since, EXCLUDED.pending_since),
            last_active_at = greatest(m.last_active_at, EXCLUDED.last_active_at)
    RETURNING m.logged_seq INTO NEW.user_seq;
    RETURN NEW;
END
$$;

-- It runs as its owner: a producer's INSERT sets it off, and a producer
-- holds no grant on archive_marks (sql/0020_tenant_roles.sql).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION track_raw_log() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;

DROP TRIGGER IF EXISTS raw_logs_track ON raw_logs;
-- A log whose user_seq is given by a role that may update raw_logs (the
-- daemon's answers: finish.sql hands out the numbers itself, set by set,
-- sql/0026_answer_logs_in_finish.sql) is not counted again.
CREATE TRIGGER raw_logs_track
    BEFORE INSERT ON raw_logs
    FOR EACH ROW
    WHEN (NEW.user_seq IS NULL OR NOT has_table_privilege('raw_logs'::regclass, 'UPDATE'))
    EXECUTE FUNCTION track_raw_log();
