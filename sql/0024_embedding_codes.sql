-- The semantic search at size: a binary code per turn embedding, for a
-- first pass that does not read every embedding of a large user.
--
-- The exact search (sql/0018_embedding_parts.sql) reads each of the user's
-- embeddings, 3.1 kB for 384 dimensions, and computes its distance to the
-- query's: about 7 µs a turn (5 ms for 680 turns), so a user of 100,000
-- turns costs most of a second per request (2.5 s measured on a loaded
-- machine, BENCHMARKS.md). Above a size (`maas.memory_exact_turns`, 20,000
-- turns by default; docs/memory.md, "At size") the search first ranks the
-- user's turns by the Hamming distance of their codes to the query's, read
-- from the index below without touching the embeddings, and computes the
-- exact cosine of the nearest 1,000 only. A code is the embedding's sign
-- bits, one per dimension (binary quantisation): for unit vectors the
-- share of differing signs estimates the angle between them
-- (random-hyperplane hashing along the coordinate axes). What it costs in
-- recall is measured by `bin/bench --only=memory-scale` (BENCHMARKS.md).
-- Below the size the search is exact, as before.

-- An embedding's code: bit i is set when component i is positive.
CREATE FUNCTION embedding_code(e real[]) RETURNS bit varying
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
        SELECT coalesce(string_agg(CASE WHEN x > 0 THEN '1' ELSE '0' END, '' ORDER BY i), '')::bit varying
        FROM unnest(e) WITH ORDINALITY AS u(x, i)
    $$;

ALTER TABLE turn_embeddings ADD COLUMN code bit varying;
-- The embeddings stored before: the code of their parts' coordinates.
UPDATE turn_embeddings e
SET code = (SELECT coalesce(string_agg(CASE WHEN cube_ll_coord(p.c, j) > 0 THEN '1' ELSE '0' END, ''
                                       ORDER BY p.k, j), '')::bit varying
            FROM unnest(e.parts) WITH ORDINALITY AS p(c, k)
            CROSS JOIN LATERAL generate_series(1, cube_dim(p.c)) AS j);
ALTER TABLE turn_embeddings ALTER COLUMN code SET NOT NULL;

-- The first pass reads this index only (an index-only scan: about 100
-- bytes a turn against 3.1 kB in the table), led by user_id (invariant 7).
CREATE INDEX turn_embeddings_code_idx ON turn_embeddings (user_id, model, dims) INCLUDE (turn_id, code);
