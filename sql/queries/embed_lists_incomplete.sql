-- Lists of model $1 whose embeddings are not all assigned yet, oldest
-- training first (embedding_lists_incomplete_idx): the embedder's
-- assignment work.
-- $1 model
-- $2 most lists
SELECT l.user_id, l.dims FROM embedding_lists l
WHERE NOT l.complete AND l.model = $1::text
ORDER BY l.trained_at
LIMIT $2
