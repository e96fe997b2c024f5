-- The newest turn's id (raw_logs_pkey, one index entry): where the
-- embedder's next scoped pass starts (embed_pending_since.sql).
SELECT coalesce(max(r.id), 0)::bigint AS top FROM raw_logs r
