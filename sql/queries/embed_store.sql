-- Stores the embeddings of user $1's turns $3 (as their parts:
-- sql/0018_embedding_parts.sql, their codes: sql/0024_embedding_codes.sql,
-- and their lists: sql/0028_embedding_lists.sql) (all of dimension $5, one
-- after another in $4) made by model $2, and moves the user's mark to $6,
-- in one statement. An embedding's list is its nearest centroid among the
-- user's own of this model (NULL while the user has none); the user's
-- lists of another model or dimensions are deleted (a change of model
-- redoes every turn, and trains new lists). A turn deleted meanwhile is skipped; a turn embedded
-- before (another model, or another daemon) is overwritten. The mark never
-- moves back, except to start over with a new model.
-- $1 user_id
-- $2 model
-- $3 turn ids (bigint[])
-- $4 embeddings (real[], $5 components each, in the order of $3)
-- $5 dimensions
-- $6 mark (user_seq)
WITH v AS (
    SELECT x.id, x.n::int AS n FROM unnest($3::bigint[]) WITH ORDINALITY AS x(id, n)
), x AS (
    SELECT v.id, embedding_parts(e.e) AS parts, embedding_code(e.e) AS code
    FROM v
    CROSS JOIN LATERAL (SELECT ($4::real[])[(v.n - 1) * $5::int + 1 : v.n * $5::int] AS e) e
), stored AS (
    INSERT INTO turn_embeddings AS e (turn_id, user_id, model, dims, parts, code, list)
    SELECT x.id, $1::uuid, $2::text, $5::int, x.parts, x.code,
           (SELECT c.list FROM embedding_centroids c
            WHERE c.user_id = $1::uuid AND c.model = $2::text AND c.dims = $5::int
            ORDER BY (SELECT sum(cube_distance(y.a, y.b) ^ 2) FROM unnest(c.parts, x.parts) AS y(a, b))
            LIMIT 1)
    FROM x
    JOIN raw_logs r ON r.id = x.id AND r.user_id = $1::uuid
    ON CONFLICT (turn_id) DO UPDATE
        SET model = EXCLUDED.model, dims = EXCLUDED.dims, parts = EXCLUDED.parts, code = EXCLUDED.code,
            list = EXCLUDED.list
    RETURNING e.turn_id
), stale AS (
    DELETE FROM embedding_lists l
    WHERE l.user_id = $1::uuid AND (l.model <> $2::text OR l.dims <> $5::int)
), mark AS (
    UPDATE archive_marks m
    SET embedded_seq = CASE WHEN m.embedded_model IS DISTINCT FROM $2::text THEN $6::bigint
                            ELSE greatest(m.embedded_seq, $6::bigint) END,
        embedded_model = $2::text
    WHERE m.user_id = $1::uuid
    RETURNING m.embedded_seq
)
SELECT (SELECT count(*) FROM stored) AS stored, (SELECT m.embedded_seq FROM mark m) AS embedded_seq
