-- Part 2 of the memory search (memory_search.sql): the hits by full text
-- alone.
), candidates AS (
    SELECT DISTINCT ON (u.id) u.* FROM (SELECT * FROM rare UNION ALL SELECT * FROM common) u
), hits AS (
    -- A candidate's score: the idf of the query lexemes it holds, over its
    -- length term (1 + k1 (1 − b + b · length / 13) = 1.3 + 0.9 · length / 13),
    -- in float8. Summed per candidate rather than grouped: a GROUP BY had
    -- to sort the candidates with their tsvectors (BENCHMARKS.md, session 7).
    SELECT c.id, c.thread_id, c.user_seq, c.created_at,
           (SELECT sum(w.idf_turn) FROM w WHERE c.search @@ w.tq) * 2.2::float8
               / (1.3::float8 + 0.9::float8 * length(c.search) / 13) AS score
    FROM candidates c
    ORDER BY score DESC, c.created_at DESC, c.id DESC
    LIMIT $3::int
