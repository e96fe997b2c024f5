-- The next $4 embeddings of user $1 (model $2, dimensions $3) past its
-- lists' `assigned_seq`, by user_seq (raw_logs_user_seq_idx, then each
-- turn's embedding by key), their parts as text: what one assignment
-- batch reads.
-- $1 user_id
-- $2 model
-- $3 dims
-- $4 most turns
SELECT r.id, r.user_seq, e.parts::text AS parts
FROM raw_logs r
CROSS JOIN LATERAL (
    SELECT e.parts FROM turn_embeddings e
    WHERE e.turn_id = r.id AND e.user_id = $1::uuid AND e.model = $2::text AND e.dims = $3::int
    LIMIT 1) e
WHERE r.user_id = $1::uuid
  AND r.user_seq > (SELECT l.assigned_seq FROM embedding_lists l
                    WHERE l.user_id = $1::uuid AND l.model = $2::text AND l.dims = $3::int)
ORDER BY r.user_seq
LIMIT $4
