-- Deletes user $1's lists of model $2 and dimensions $3, their centroids
-- with them (ON DELETE CASCADE); the embeddings' list numbers stay until
-- lists are trained again, and no search reads them meanwhile.
-- $1 user_id
-- $2 model
-- $3 dims
DELETE FROM embedding_lists WHERE user_id = $1::uuid AND model = $2::text AND dims = $3::int
