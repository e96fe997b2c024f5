-- Fewer index entries per request: no index on a column that an update on
-- the hot path changes unless it serves that path, so that such an update
-- writes no entry it does not need, and more of them are HOT (a heap-only
-- update: no index entry at all, the new row version on the same page).
-- `bin/bench --only=writes` counts the entries per index and request from
-- the WAL; the figures before and after are in BENCHMARKS.md ("Writes per
-- request").
--
-- pipeline_runs: a status change cannot be HOT (the claim's index is on
-- status), but each index whose key or predicate holds status takes an
-- entry for every row version of the statuses it covers. The console's
-- status index covered every status, so it took one at the insert and at
-- every status change (four per request); it now leaves out the in-flight
-- statuses (two per request: the insert and the finish; a chained row goes
-- from one in-flight status to the next). The in-flight statuses are listed
-- from pipeline_runs_in_flight_idx, in the list's order. (Terminal statuses
-- alone would save one entry more, but the dispatchable ones would then be
-- listed by filtering pipeline_runs_created_idx, which the planner prefers
-- to sorting the backlog: 280 ms at 1 million rows for a backlog older than
-- the newest 190,000 requests, 0.2 ms with this index.)
--
-- The in-flight index replaces the lease index, whose key was
-- lease_expires_at: every heartbeat changed it, so every heartbeat wrote a
-- new entry into each index of the table (five or more). Keyed on status
-- instead (in flight exactly while a lease is held:
-- pipeline_runs_lease_matches_status), a heartbeat is HOT. The sweep reads
-- every in-flight row (as many as the daemons' concurrency) to find the
-- expired ones, instead of a range of the lease index; the statements that
-- read leased rows say `status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING')`
-- so that they can use it. The claim and a chained finish write one entry
-- into it, as they did into the lease index.
--
-- archive_marks: every log of a user bumps logged_seq (triggers/0004), and
-- the pending index's predicate named it (archived_seq < logged_seq), so no
-- such update was HOT: two index entries per log. pending_since is set
-- exactly while something is pending (the trigger sets it with the first
-- pending log; archive_commit.sql clears it when nothing is left), so the
-- predicate `pending_since IS NOT NULL` holds the same rows, and the bump is
-- HOT where the page has room for the new version. Inserts leave half of
-- each page free (fillfactor 50): a user's first answer updates the row its
-- query's log inserted moments before, on a page of other new users' rows
-- that are about to be updated too; with 90 only one such update in seven
-- found room (measured). The table has one narrow row per user.
--
-- raw_logs: raw_logs_user_idx (user_id, id) served nothing that
-- raw_logs_user_seq_idx (user_id, user_seq) does not: every statement that
-- reads a user's logs orders them by user_seq or reads them all. One entry
-- per log less.
--
-- Built inside the migration's transaction (writes to these tables wait
-- for it): the new indexes hold only in-flight or terminal rows; on a large
-- table, build them beforehand with CREATE INDEX CONCURRENTLY (the status
-- index under another name, then drop the old one and rename it), as for
-- sql/0013_console_lists.sql.

CREATE INDEX IF NOT EXISTS pipeline_runs_in_flight_idx
    ON pipeline_runs (status, created_at DESC, id DESC)
    WHERE status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING');
DROP INDEX IF EXISTS pipeline_runs_lease_idx;

DROP INDEX IF EXISTS pipeline_runs_status_created_idx;
CREATE INDEX pipeline_runs_status_created_idx
    ON pipeline_runs (status, created_at DESC, id DESC)
    WHERE status NOT IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING');

DROP INDEX IF EXISTS archive_marks_pending_idx;
CREATE INDEX archive_marks_pending_idx ON archive_marks (pending_since)
    WHERE pending_since IS NOT NULL;
ALTER TABLE archive_marks SET (fillfactor = 50);

DROP INDEX IF EXISTS raw_logs_user_idx;
