-- The memory search reads its GIN indexes on every request. A GIN index
-- keeps new entries in a pending list that every scan reads whole until it
-- is merged, and PostgreSQL's default lets it grow to 4 MB: other users'
-- turns read by each of the search's lookups. Measured in bin/bench (a
-- user of 2,000 turns, the pending list left by loading 200,000 turns):
-- the difference between a request with memory and one without was 9.1 ms
-- with the default; 3.0 ms with fastupdate off, but producers' inserts of
-- turns were 30 % slower; 3.5 ms with a pending list of at most 128 kB,
-- which keeps inserts batched (their rate within 8 % of the default's)
-- and a scan's extra read small (BENCHMARKS.md, session 5).
ALTER INDEX raw_logs_search_idx SET (gin_pending_list_limit = 128);
ALTER INDEX lsm_storage_search_idx SET (gin_pending_list_limit = 128);
-- Entries already pending are merged now, not at the next VACUUM.
SELECT gin_clean_pending_list('raw_logs_search_idx'::regclass);
SELECT gin_clean_pending_list('lsm_storage_search_idx'::regclass);
