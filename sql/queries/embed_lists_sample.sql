-- A sample of user $1's embeddings of model $2 and dimensions $3, to train
-- its lists from: $4 of them drawn evenly at random, by a hash of the turn
-- id (their ids read from turn_embeddings_list_idx, the user's entries
-- only, then the top $4 by hash). Not every n-th id: a user's ids repeat
-- with the turns' own rhythm (a question then its answer, logged
-- together), and a step that shares the rhythm's period samples one kind
-- of turn, or a few of its topics, only; nor the first $4 in the index's
-- order, which is the current lists' order. Their parts as text (a
-- cube[]'s output, parsed by the embedder).
-- $1 user_id
-- $2 model
-- $3 dims
-- $4 most embeddings
SELECT e.parts::text AS parts
FROM (SELECT c.turn_id FROM turn_embeddings c
      WHERE c.user_id = $1::uuid AND c.model = $2::text AND c.dims = $3::int
      ORDER BY hashint8(c.turn_id), c.turn_id
      LIMIT $4) c
CROSS JOIN LATERAL (
    SELECT e.parts FROM turn_embeddings e WHERE e.turn_id = c.turn_id AND e.user_id = $1::uuid LIMIT 1) e
