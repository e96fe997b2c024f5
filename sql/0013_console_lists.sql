-- The operator console's request list (sql/queries/console_list.sql) pages
-- newest first by keyset on (created_at, id), filtered by status, user,
-- thread and a time range. Each filter that can stand alone has an index
-- that returns its rows already in the list's order, so a page reads about
-- as many index entries as it shows, whatever the table's size; a keyset
-- bound or time range is a range condition on the same index.
--
-- Measured with EXPLAIN ANALYZE on 10 million requests: the list without a
-- filter took 7.3 s before (a sort of the whole table), 0.2 ms after; every
-- filter and combination below 3 ms, except the bounded windows below; a
-- thread filter read the whole table. Pages over HTTP: BENCHMARKS.md
-- ("Console"). The user filter already had pipeline_runs_user_idx
-- (user_id, created_at); it is rebuilt with id so that the keyset's
-- (created_at, id) < (…) is an index condition (no extra index).
--
-- The text filter has no index of its own: a trigram index on user_query
-- would need the pg_trgm extension (not on every managed server) and would
-- take an entry for every trigram of the query at every non-HOT update of
-- the request (several per request, on the hot path). Instead a text
-- search reads at most a bounded number of the newest rows that match the
-- other filters and says how far it got; the next page continues from
-- there (console_list.sql). So is a status given with a user or thread.
--
-- Every index on pipeline_runs costs each status change (a non-HOT
-- update: status is indexed already) one more index entry; bin/bench's
-- throughput measures it (BENCHMARKS.md).
--
-- CREATE INDEX here blocks writes to pipeline_runs while it builds (the
-- migration runs in one transaction; CONCURRENTLY cannot). On a large
-- table, build the first three beforehand with CREATE INDEX CONCURRENTLY
-- under the same names: IF NOT EXISTS then skips them (about 15 s each at
-- 10 million rows on 2 cores).

CREATE INDEX IF NOT EXISTS pipeline_runs_created_idx
    ON pipeline_runs (created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS pipeline_runs_status_created_idx
    ON pipeline_runs (status, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS pipeline_runs_thread_created_idx
    ON pipeline_runs (thread_id, created_at DESC, id DESC) WHERE thread_id IS NOT NULL;

DROP INDEX IF EXISTS pipeline_runs_user_idx;
CREATE INDEX pipeline_runs_user_idx ON pipeline_runs (user_id, created_at, id);
