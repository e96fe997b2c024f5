-- Part 2 of the memory search (memory_search.sql), when embeddings are on
-- (`[llm.embedding]`): the hits by full text fused with embeddings.
--
-- $10 embedding (real[], unit length: the query's embedding)
-- $11 model (the model of $10; only turn embeddings of that model are compared)
-- $12 weight (of the semantic part in a hit's score, 0 to 1; the default
--     0.6 fitted leave-one-conversation-out: BENCHMARKS.md, session 27)
--
-- The cosine of the query's embedding with each of the user's turn
-- embeddings (turn_embeddings_list_idx, never another user's rows); the
-- 100 nearest turns join the full-text candidates. A user of more turns
-- than `maas.memory_exact_turns` (a setting; 3,000 when unset) is
-- searched approximately instead (docs/memory.md, "At size"):
-- - with its lists complete (sql/0028_embedding_lists.sql): the
--   `maas.memory_lists_probed` lists (8 when unset) whose centroids are
--   nearest the query, the 500 turns of those whose codes are nearest the
--   query's by Hamming distance (read from turn_embeddings_list_idx
--   alone), then the exact cosine of those;
-- - else (lists not yet trained or assigned): the 1,000 turns of all
--   whose codes are nearest (sql/0024_embedding_codes.sql), then the
--   exact cosine of those.
-- The scaling below is then over those turns and the full-text
-- candidates, whose cosine is computed too. A candidate's score is
-- (1 − $12) · its BM25 score over the best BM25
-- score of the candidates + $12 · its cosine scaled to 0..1 over the
-- user's turns (min to max): linear fusion, which beat reciprocal rank
-- fusion by 5 points of recall on LoCoMo (BENCHMARKS.md, session 8).
), query_parts AS (
    SELECT embedding_parts($10::real[]) AS parts, embedding_code($10::real[]) AS code
), size AS (
    -- One decision per search, from the user's count of logged turns and
    -- its lists: 'exact', 'lists' or 'codes'.
    SELECT CASE WHEN n.turns <= coalesce(nullif(current_setting('maas.memory_exact_turns', true), '')::float8, 3000)
                THEN 'exact'
                WHEN EXISTS (SELECT 1 FROM embedding_lists l
                             WHERE l.user_id = $1::uuid AND l.model = $11::text
                               AND l.dims = cardinality($10::real[]) AND l.complete)
                THEN 'lists'
                ELSE 'codes' END AS path
    FROM n
), probed AS (
    -- The lists whose centroids are nearest the query (squared distance
    -- over the parts, as below).
    SELECT array_agg(c.list) AS lists
    FROM (SELECT c.list FROM embedding_centroids c
          WHERE $3::int > 0 AND (SELECT s.path FROM size s) = 'lists'
            AND c.user_id = $1::uuid AND c.model = $11::text AND c.dims = cardinality($10::real[])
          ORDER BY (SELECT sum(cube_distance(x.a, x.b) ^ 2)
                    FROM unnest(c.parts, (SELECT q.parts FROM query_parts q)) AS x(a, b))
          LIMIT coalesce(nullif(current_setting('maas.memory_lists_probed', true), '')::int, 8)) c
), dense AS MATERIALIZED (
    -- Both of unit length: the cosine is 1 − |a − b|² / 2, the squared
    -- distance summed over the parts (sql/0018_embedding_parts.sql).
    -- Exact: every embedding of the user (a one-time filter keeps the
    -- other branches from running).
    SELECT e.turn_id AS id,
           1 - (SELECT sum(cube_distance(x.a, x.b) ^ 2) FROM unnest(e.parts, q.parts) AS x(a, b)) / 2 AS cosine
    FROM turn_embeddings e
    CROSS JOIN query_parts q
    WHERE $3::int > 0 AND (SELECT s.path FROM size s) = 'exact' AND e.user_id = $1::uuid AND e.model = $11::text
      -- (a model that changed its dimensions under the same name is skipped)
      AND e.dims = cardinality($10::real[])
    UNION ALL
    -- Approximate: the nearest codes first (of the probed lists, or of
    -- all), then the exact cosine of those.
    SELECT e.turn_id,
           1 - (SELECT sum(cube_distance(x.a, x.b) ^ 2) FROM unnest(e.parts, q.parts) AS x(a, b)) / 2
    FROM ((SELECT c.turn_id
           -- (each probed list read by its own key: with `list = ANY (…)`
           -- the generic plan read all of the user's codes; no lists are
           -- probed off the 'lists' path)
           FROM unnest((SELECT p.lists FROM probed p)::int[]) AS l(list)
           CROSS JOIN LATERAL (
               SELECT c.turn_id, c.code FROM turn_embeddings c
               WHERE c.user_id = $1::uuid AND c.model = $11::text
                 AND c.dims = cardinality($10::real[]) AND c.list = l.list
               OFFSET 0) c
           -- (the query's code as a parameter, not a join: a join costs a
           -- step per turn)
           ORDER BY bit_count(c.code # (SELECT q.code FROM query_parts q))
           LIMIT 500)
          UNION ALL
          (SELECT c.turn_id
           FROM turn_embeddings c
           WHERE $3::int > 0 AND (SELECT s.path FROM size s) = 'codes' AND c.user_id = $1::uuid
             AND c.model = $11::text AND c.dims = cardinality($10::real[])
           ORDER BY bit_count(c.code # (SELECT q.code FROM query_parts q))
           LIMIT 1000)) c
    -- (a lookup by key each: a join could read the user's every row)
    CROSS JOIN LATERAL (
        SELECT e.turn_id, e.parts FROM turn_embeddings e
        WHERE e.turn_id = c.turn_id AND e.user_id = $1::uuid
        LIMIT 1) e
    CROSS JOIN query_parts q
), near AS (
    SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search, r.speaker, r.by_user
    FROM (SELECT d.id FROM dense d ORDER BY d.cosine DESC LIMIT 100) d
    -- (a lookup by key each: with a generic plan, a join was seen to read
    -- all of a large user's turns)
    CROSS JOIN LATERAL (
        SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search,
               substring(left(r.content, 42) from '^([[:alpha:]][[:alnum:]._-]*(?: +[[:alnum:]._-]+){0,2}): ') AS speaker,
               r.message_type = 'user_query' AS by_user
        FROM raw_logs r
        WHERE r.id = d.id AND r.user_id = $1::uuid AND r.request_id IS DISTINCT FROM $8::uuid
        LIMIT 1) r
), candidates AS (
    SELECT DISTINCT ON (u.id) u.*
    FROM (SELECT * FROM rare UNION ALL SELECT * FROM common UNION ALL SELECT * FROM near) u
), missing AS MATERIALIZED (
    -- Approximate paths: the exact cosine of the candidates the nearest
    -- codes left out (the full-text ones), a lookup by key each, so that
    -- every candidate is scored on both parts as on the exact path; left
    -- without it, a turn that shares the query's words but sits in a list
    -- not probed scored as the farthest of all (0), and recall of all
    -- evidence through lists fell 8 points instead of 2 (BENCHMARKS.md,
    -- session 28). Nothing on the exact path, where dense holds them all.
    SELECT c.id,
           1 - (SELECT sum(cube_distance(x.a, x.b) ^ 2) FROM unnest(e.parts, q.parts) AS x(a, b)) / 2 AS cosine
    FROM candidates c
    CROSS JOIN LATERAL (
        SELECT e.parts FROM turn_embeddings e
        WHERE e.turn_id = c.id AND e.user_id = $1::uuid AND e.model = $11::text
          AND e.dims = cardinality($10::real[])
        LIMIT 1) e
    CROSS JOIN query_parts q
    WHERE (SELECT s.path FROM size s) <> 'exact' AND NOT EXISTS (SELECT 1 FROM dense d WHERE d.id = c.id)
), cosines AS (
    SELECT d.id, d.cosine FROM dense d
    UNION ALL
    SELECT m.id, m.cosine FROM missing m
), span AS (
    SELECT min(d.cosine) AS lo, greatest(max(d.cosine) - min(d.cosine), 1e-9) AS width FROM cosines d
), named AS (
    -- The candidates' speakers the query names (see "Speakers" in
    -- memory_search.sql).
    SELECT s.speaker FROM (SELECT DISTINCT c.speaker FROM candidates c WHERE c.speaker IS NOT NULL) s
    WHERE to_tsvector('maas_memory', s.speaker) @@ (SELECT anyq.tq FROM anyq)
), scored AS MATERIALIZED (
    -- (materialized: hits reads the score twice, and an inlined subquery
    -- would run twice per candidate). A candidate's BM25 score: the idf of the query lexemes it holds, over
    -- its length term (1 + k1 (1 − b + b · length / 13) = 1.3 + 0.9 · length / 13),
    -- in float8. Summed per candidate rather than grouped: a GROUP BY had
    -- to sort the candidates with their tsvectors (BENCHMARKS.md, session 7).
    SELECT c.id, c.thread_id, c.user_seq, c.created_at,
           coalesce((SELECT sum(w.idf_turn) FROM w WHERE c.search @@ w.tq), 0) * 2.2::float8
               / (1.3::float8 + 0.9::float8 * length(c.search) / 13) AS bm25,
           (c.speaker IN (SELECT n.speaker FROM named n) OR ($9::boolean AND c.by_user)) AS named
    FROM candidates c
), hits AS (
    SELECT s.id, s.thread_id, s.user_seq, s.created_at,
           (1 - $12::float8) * s.bm25 / greatest(max(s.bm25) OVER (), 1e-9)
               + $12::float8 * coalesce((d.cosine - span.lo) / span.width, 0)
               + CASE WHEN s.named THEN 0.15::float8 ELSE 0 END AS score
    FROM scored s
    CROSS JOIN span
    LEFT JOIN cosines d ON d.id = s.id
    ORDER BY score DESC, s.created_at DESC, s.id DESC
    LIMIT $3::int
