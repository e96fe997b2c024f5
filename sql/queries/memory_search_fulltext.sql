-- Part 2 of the memory search (memory_search.sql): the hits by full text
-- alone.
), candidates AS (
    SELECT DISTINCT ON (u.id) u.* FROM (SELECT * FROM rare UNION ALL SELECT * FROM common) u
), named AS (
    -- The candidates' speakers the query names (see "Speakers" in
    -- memory_search.sql).
    SELECT s.speaker FROM (SELECT DISTINCT c.speaker FROM candidates c WHERE c.speaker IS NOT NULL) s
    WHERE to_tsvector('maas_memory', s.speaker) @@ (SELECT anyq.tq FROM anyq)
), scored AS (
    -- A candidate's score: the idf of the query lexemes it holds, over its
    -- length term (1 + k1 (1 − b + b · length / 13) = 1.3 + 0.9 · length / 13),
    -- in float8. Summed per candidate rather than grouped: a GROUP BY had
    -- to sort the candidates with their tsvectors (BENCHMARKS.md, session 7).
    SELECT c.id, c.thread_id, c.user_seq, c.created_at,
           (SELECT sum(w.idf_turn) FROM w WHERE c.search @@ w.tq) * 2.2::float8
               / (1.3::float8 + 0.9::float8 * length(c.search) / 13) AS bm25,
           (c.speaker IN (SELECT n.speaker FROM named n) OR ($9::boolean AND c.by_user)) AS named
    FROM candidates c
), hits AS (
    -- (a named speaker's turn: a tenth of the best score more; the
    -- semantic part, whose scores are over the best one, adds 0.15)
    SELECT s.id, s.thread_id, s.user_seq, s.created_at,
           s.bm25 + CASE WHEN s.named THEN 0.1::float8 * max(s.bm25) OVER () ELSE 0 END AS score
    FROM scored s
    ORDER BY score DESC, s.created_at DESC, s.id DESC
    LIMIT $3::int
