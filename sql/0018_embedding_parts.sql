-- The semantic search's cosine computed in C instead of SQL. 0017 stored an
-- embedding as real[] and the search multiplied it out with unnest, about
-- 30 µs a turn (21 ms for a user of 680 turns). PostgreSQL has no vector
-- type of its own, and the contrib extension `cube` (in the same package as
-- btree_gin, which 0008 requires; trusted, so a database owner may create
-- it) holds at most 100 dimensions. So an embedding is stored as its parts:
-- consecutive runs of 96 components, each a cube. For unit vectors
-- |a − b|² = 2 − 2 a·b, and the squared distance is the sum over the
-- parts, so the cosine is 1 − Σ cube_distance(aₖ, bₖ)² / 2: four C calls a
-- turn for 384 dimensions. Measured on the LoCoMo users (680 turns, 384
-- dimensions, generic plan): 5 ms against 29 ms (BENCHMARKS.md, session 9).
--
-- The parts are kept in the row (STORAGE MAIN, toast_tuple_target at its
-- maximum): 384 dimensions take 3.1 kB, which would otherwise be moved to
-- TOAST and read back from there for every turn of every search.
CREATE EXTENSION IF NOT EXISTS cube;

-- An embedding's parts (runs of 96 components, the last one shorter).
CREATE FUNCTION embedding_parts(e real[]) RETURNS cube[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
        SELECT ARRAY(SELECT cube(e[i : i + 95]::float8[])
                     FROM generate_series(1, cardinality(e), 96) AS i
                     ORDER BY i)
    $$;

ALTER TABLE turn_embeddings
    ADD COLUMN dims integer,
    ADD COLUMN parts cube[];
UPDATE turn_embeddings SET dims = cardinality(embedding), parts = embedding_parts(embedding);
ALTER TABLE turn_embeddings
    ALTER COLUMN dims SET NOT NULL,
    ALTER COLUMN parts SET NOT NULL,
    ALTER COLUMN parts SET STORAGE MAIN,
    DROP COLUMN embedding,
    SET (toast_tuple_target = 8160);
