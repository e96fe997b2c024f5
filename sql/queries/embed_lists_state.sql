-- User $1's lists of model $2 and dimensions $3 (sql/0028_embedding_lists.sql),
-- and how many embeddings of that model and dimensions it has
-- (turn_embeddings_list_idx, the user's entries only). No row: no lists.
-- $1 user_id
-- $2 model
-- $3 dims
SELECT (SELECT count(*) FROM turn_embeddings e
        WHERE e.user_id = $1::uuid AND e.model = $2::text AND e.dims = $3::int) AS turns,
       l.lists, l.trained_turns, l.complete
FROM (SELECT 1) one
LEFT JOIN embedding_lists l ON l.user_id = $1::uuid AND l.model = $2::text AND l.dims = $3::int
