-- Gives user $1's embeddings $4 (model $2, dimensions $3) the lists $5
-- (in the same order), moves the lists' `assigned_seq` to $7 and sets
-- `complete` to $8, in one statement, only while the lists are still those
-- trained at $6 (a training in between restarts the assignment from the
-- first turn, and this batch changes nothing). Embeddings stored
-- meanwhile have their list already (embed_store.sql).
-- $1 user_id
-- $2 model
-- $3 dims
-- $4 turn ids (bigint[])
-- $5 lists (int[])
-- $6 trained_at
-- $7 assigned_seq
-- $8 complete
WITH current AS MATERIALIZED (
    SELECT 1 FROM embedding_lists l
    WHERE l.user_id = $1::uuid AND l.model = $2::text AND l.dims = $3::int AND l.trained_at = $6::timestamptz
), assigned AS (
    UPDATE turn_embeddings e SET list = x.list
    FROM unnest($4::bigint[], $5::int[]) AS x(id, list)
    WHERE e.turn_id = x.id AND e.user_id = $1::uuid AND e.model = $2::text AND e.dims = $3::int
      AND EXISTS (SELECT 1 FROM current)
    RETURNING 1
), state AS (
    UPDATE embedding_lists l
    SET assigned_seq = greatest(l.assigned_seq, $7::int8), complete = $8::bool
    WHERE l.user_id = $1::uuid AND l.model = $2::text AND l.dims = $3::int AND l.trained_at = $6::timestamptz
    RETURNING 1
)
SELECT (SELECT count(*) FROM assigned) AS assigned, (SELECT count(*) FROM state) > 0 AS current
