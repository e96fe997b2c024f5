-- The operator console's request list, newest first, paged by keyset on
-- (created_at, id): a page starts strictly after the last row of the one
-- before, never at an OFFSET. NULL filters mean any.
--
-- Indexes (sql/0013_console_lists.sql): no filter or a time range reads
-- pipeline_runs_created_idx; a status pipeline_runs_status_created_idx,
-- or pipeline_runs_in_flight_idx for an in-flight one
-- (sql/0025_fewer_index_writes.sql); a user pipeline_runs_user_idx; a
-- thread pipeline_runs_thread_created_idx.
-- Each returns rows in the list's order, so a page reads about $9 entries.
-- One status is compared with `=`, not `= ANY`: only an equality makes
-- the status index's order the list's order (PostgreSQL 15).
--
-- A page is read from one index; a filter that index does not serve is
-- bounded instead: the text (a case-insensitive substring, no index), and
-- the status when a user or thread is given (their index has no status;
-- a user of 30,000 requests with 2 % CANCELLED took 50 ms). Such a page
-- reads at most $10 of the newest rows matching the indexed filters
-- (`scanned`) and keeps those that match the rest. Besides the matches,
-- the result then has one `edge` row: the oldest row it read, with `scanned`, how
-- many it read, when the matches did not fill the page. When it read
-- fewer than $10, the search reached the end; otherwise the next page
-- starts after the edge (or after the last match, when the page is full).
-- $1 statuses
-- $2 user_id
-- $3 thread_id
-- $4 text
-- $5 before_created
-- $6 before_id
-- $7 since
-- $8 until
-- $9 limit
-- $10 scan
-- $11 tenant
-- With a tenant ($11), only its requests, with the user ids it uses (no
-- index of its own: its rows are read from the list's indexes and
-- filtered).
WITH scanned AS MATERIALIZED (
    SELECT id, status,
           CASE WHEN $11::uuid IS NULL THEN user_id ELSE coalesce(tenant_user_id, user_id) END AS user_id,
           thread_id, attempt, debug, held, created_at, updated_at, error,
           user_query, row_number() OVER (ORDER BY created_at DESC, id DESC) AS n
    FROM pipeline_runs
    WHERE ($1::text[] IS NULL OR $2::uuid IS NOT NULL OR $3::uuid IS NOT NULL
           OR CASE WHEN cardinality($1::text[]) = 1 THEN status = ($1::text[])[1]
                   ELSE status = ANY($1::text[]) END)
      AND ($2::uuid IS NULL OR user_id = $2::uuid)
      AND ($3::uuid IS NULL OR thread_id = $3::uuid)
      AND ($7::timestamptz IS NULL OR created_at >= $7::timestamptz)
      AND ($8::timestamptz IS NULL OR created_at < $8::timestamptz)
      AND ($5::timestamptz IS NULL OR (created_at, id) < ($5::timestamptz, $6::uuid))
      AND ($11::uuid IS NULL OR tenant_id = $11::uuid)
    ORDER BY created_at DESC, id DESC
    LIMIT CASE WHEN $4::text IS NULL AND ($1::text[] IS NULL OR ($2::uuid IS NULL AND $3::uuid IS NULL))
               THEN $9::int8 ELSE $10::int8 END
), hits AS MATERIALIZED (
    -- No ORDER BY: a CTE is read lazily, in the order it produces rows
    -- (newest first, `n`), so this stops reading `scanned` at a page's
    -- last match instead of reading the whole window; the caller orders
    -- by `n`.
    SELECT * FROM scanned
    WHERE ($4::text IS NULL OR strpos(lower(user_query), lower($4::text)) > 0)
      AND ($1::text[] IS NULL OR status = ANY($1::text[]))
    LIMIT $9::int8
)
SELECT id, status, user_id, thread_id, attempt, debug, held, created_at, updated_at, error,
       left(user_query, 120) AS query, false AS edge, n AS scanned
FROM hits
UNION ALL
-- The edge, only when the window was read whole (fewer matches than a page).
SELECT id, status, user_id, thread_id, attempt, debug, held, created_at, updated_at, error,
       left(user_query, 120) AS query, true AS edge, n AS scanned
FROM scanned
WHERE ($4::text IS NOT NULL OR ($1::text[] IS NOT NULL AND ($2::uuid IS NOT NULL OR $3::uuid IS NOT NULL)))
  AND (SELECT count(*) FROM hits) < $9::int8
  AND n = (SELECT max(n) FROM scanned)
