-- User $1's centroids of model $2 and dimensions $3, in list order, as
-- text (a cube[]'s output: the embedder parses the components), and when
-- they were trained (the assignment's check that they are still current).
-- $1 user_id
-- $2 model
-- $3 dims
SELECT c.parts::text AS parts, l.trained_at
FROM embedding_lists l
JOIN embedding_centroids c ON c.user_id = l.user_id AND c.model = l.model AND c.dims = l.dims
WHERE l.user_id = $1::uuid AND l.model = $2::text AND l.dims = $3::int
ORDER BY c.list
