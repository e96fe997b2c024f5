-- Stores user $1's new lists of model $2 and dimensions $3: $4 centroids
-- (unit length, $3 components each, one after another in $5), trained
-- from $6 embeddings, in one statement. The user's embeddings are then
-- assigned anew from the first (`assigned_seq` 0, not `complete`): the
-- search takes the path without lists until they are.
-- $1 user_id
-- $2 model
-- $3 dims
-- $4 lists
-- $5 centroids (real[])
-- $6 trained turns
WITH state AS (
    INSERT INTO embedding_lists AS l (user_id, model, dims, lists, trained_turns)
    VALUES ($1::uuid, $2::text, $3::int, $4::int, $6::int8)
    ON CONFLICT (user_id, model, dims) DO UPDATE
        SET lists = EXCLUDED.lists, trained_turns = EXCLUDED.trained_turns, assigned_seq = 0,
            complete = false, trained_at = now()
    RETURNING 1
), put AS (
    INSERT INTO embedding_centroids AS c (user_id, model, dims, list, parts)
    SELECT $1::uuid, $2::text, $3::int, k - 1,
           embedding_parts(($5::real[])[(k - 1) * $3::int + 1 : k * $3::int])
    FROM generate_series(1, $4::int) k
    ON CONFLICT (user_id, model, dims, list) DO UPDATE SET parts = EXCLUDED.parts
    RETURNING 1
), gone AS (
    DELETE FROM embedding_centroids c
    WHERE c.user_id = $1::uuid AND c.model = $2::text AND c.dims = $3::int AND c.list >= $4::int
)
SELECT count(*) AS centroids FROM put
