-- Size of the tables an operator watches, from the statistics views (no
-- scan of the tables): live rows (pg_stat_user_tables.n_live_tup, kept by
-- the server as rows are written) and bytes on disk, indexes and TOAST
-- included.
SELECT s.relname::text AS table_name,
       s.n_live_tup::int8 AS live_rows,
       pg_total_relation_size(s.relid)::int8 AS bytes
FROM pg_stat_user_tables s
WHERE s.relid IN ('pipeline_runs'::regclass, 'raw_logs'::regclass, 'lsm_storage'::regclass)
