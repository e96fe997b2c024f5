-- A sample of user $1's embeddings of model $2 and dimensions $3, to train
-- its lists from: the turns whose id is a multiple of $4 (their ids read
-- from turn_embeddings_list_idx, the user's entries only), at most $5,
-- their parts as text (a cube[]'s output, parsed by the embedder).
-- $1 user_id
-- $2 model
-- $3 dims
-- $4 step
-- $5 most embeddings
SELECT e.parts::text AS parts
FROM (SELECT c.turn_id FROM turn_embeddings c
      WHERE c.user_id = $1::uuid AND c.model = $2::text AND c.dims = $3::int AND c.turn_id % $4::int8 = 0
      LIMIT $5) c
CROSS JOIN LATERAL (
    SELECT e.parts FROM turn_embeddings e WHERE e.turn_id = c.turn_id AND e.user_id = $1::uuid LIMIT 1) e
