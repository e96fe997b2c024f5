-- The memory of one request, short-term and long-term, in one statement
-- (src/repo/memory.rs). Every scan is filtered by the user (invariant 7)
-- and goes through an index that leads with user_id: the (user_id, search)
-- GIN indexes for the search, raw_logs_user_seq_idx for the neighbours,
-- raw_logs_thread_idx for the thread; another user's rows are never read.
-- The request's own turns (its query, logged on submit) are never returned.
--
-- $1 user_id (uuid)
-- $2 query (the request's query, plus the analysis' search_keywords; empty: no long-term search)
-- $3 hits (most matching turns, e.g. 40; 0: no long-term turns)
-- $4 window (same-thread neighbours each side of a hit; 2 measured best)
-- $5 records (most matching records; 0 for none)
-- $6 thread_id (the request's thread; NULL: no short-term turns)
-- $7 thread_turns (newest turns of that thread)
-- $8 request_id (the request itself, whose turns are left out)
-- $9 embedding (real[], unit length: the query's embedding; NULL: no semantic part)
-- $10 model (the model of $9; only turn embeddings of that model are compared)
-- $11 weight (of the semantic part in a hit's score, 0 to 1; 0.5 measured best)
--
-- Short-term: the newest $7 turns of the thread $6, archived or not, why
-- 'thread', score 0, newest first.
--
-- Long-term scoring: Okapi BM25 (k1 1.2, b 0.75) with the user's own document
-- frequencies, term frequency counted as 1 (a chat turn rarely repeats a
-- word: on LoCoMo recall of all evidence stayed 0.758, any 0.859 against
-- 0.866 — within the run-to-run spread — and counting repeats cost an
-- unnest of every candidate's lexemes, 40 % of the statement's time),
-- document length = distinct
-- lexemes over an average of 13 (LoCoMo's chat turns). The query is an OR
-- of its lexemes (at most 32): an AND (plainto_tsquery) finds all words in
-- one turn for 1 in 10 questions only. Ties: the newer turn first.
--
-- Bounded work, whatever the size of the user's history: one GIN lookup per
-- lexeme reads at most 256 of its turns, which gives its document frequency
-- (a lexeme found that often is common — a speaker's name, "go", "like" —
-- and scores with the idf of 256) and, for the rarer lexemes, the
-- candidates themselves. A candidate is scored by testing each query lexeme
-- against its tsvector (`@@`), so common lexemes still add to the turns
-- that hold them. Only when fewer than 40 turns match a rarer lexeme are
-- the newest 256 turns matching any lexeme scored besides. On LoCoMo this
-- picks the same hits as scoring every matching turn (BENCHMARKS.md).
--
-- Semantic part (only when $9 is given, `[llm.embedding]`): the cosine of
-- the query's embedding with each of the user's turn embeddings
-- (turn_embeddings_user_idx); the 100 nearest turns join the candidates. A
-- candidate's score is then (1 − $11) · its BM25 score over the best BM25
-- score of the candidates + $11 · its cosine scaled to 0..1 over the
-- user's turns (min to max): linear fusion, which beat reciprocal rank
-- fusion by 5 points of recall on LoCoMo (BENCHMARKS.md, "Semantic memory
-- search"). Without $9 the score is the BM25 score, as before.
--
-- Rows: kind ('turn' | 'record'), id, why ('thread' | 'hit' | 'neighbour' |
-- 'record'), hit_id (the turn whose window brought the row; its own id for a
-- hit), score (of that hit), thread_id, message_type, content, created_at (a
-- record's time_bucket_start), period_end (a record's time_bucket_end).
-- Order: the thread's turns first (newest first), then the long-term items
-- in the order the assembler packs them: by the hit's score, then the hit
-- before its neighbours, nearer neighbours first. A turn in several windows
-- comes once, with its best hit.
WITH q AS (
    SELECT DISTINCT l.lexeme, quote_literal(l.lexeme)::tsquery AS tq
    FROM unnest(to_tsvector('maas_memory', $2::text)) AS l
    LIMIT 32
), n AS (
    SELECT greatest(coalesce((SELECT m.logged_seq FROM archive_marks m WHERE m.user_id = $1::uuid), 0), 1)::float8 AS turns,
           greatest(CASE WHEN $5::int > 0 THEN (SELECT count(*) FROM lsm_storage s WHERE s.user_id = $1::uuid) ELSE 0 END, 1)::float8 AS records
), m AS MATERIALIZED (
    -- Each lexeme's turns, at most 256 (one GIN lookup each).
    SELECT q.lexeme, r.id, r.thread_id, r.user_seq, r.created_at, r.search, r.request_id
    FROM q
    CROSS JOIN LATERAL (
        SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search, r.request_id
        FROM raw_logs r
        WHERE $3::int > 0 AND r.user_id = $1::uuid AND r.search @@ q.tq
        LIMIT 256) r
), df AS (
    -- Each lexeme's document frequency (up to 256), in one pass over m.
    SELECT m.lexeme, count(*)::float8 AS turns FROM m GROUP BY m.lexeme
), w AS (
    SELECT q.lexeme, q.tq, d.turns,
           ln(1 + (n.turns - d.turns + 0.5) / (d.turns + 0.5)) AS idf_turn,
           ln(1 + (n.records - d.records + 0.5) / (d.records + 0.5)) AS idf_record
    FROM q
    CROSS JOIN n
    LEFT JOIN df ON df.lexeme = q.lexeme
    CROSS JOIN LATERAL (
        SELECT coalesce(df.turns, 0) AS turns,
               CASE WHEN $5::int > 0 THEN
                   (SELECT count(*) FROM lsm_storage s
                    WHERE s.user_id = $1::uuid AND s.search @@ q.tq)
               ELSE 0 END::float8 AS records) d
), anyq AS (
    SELECT string_agg(quote_literal(w.lexeme), ' | ')::tsquery AS tq FROM w
), rare AS MATERIALIZED (
    SELECT DISTINCT ON (m.id) m.id, m.thread_id, m.user_seq, m.created_at, m.search
    FROM m JOIN w ON w.lexeme = m.lexeme AND w.turns < 256
    WHERE m.request_id IS DISTINCT FROM $8::uuid
), common AS (
    SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search
    FROM anyq
    JOIN raw_logs r ON r.user_id = $1::uuid AND r.search @@ anyq.tq
                   AND r.request_id IS DISTINCT FROM $8::uuid
    WHERE (SELECT count(*) FROM rare) < 40
    ORDER BY r.user_seq DESC
    LIMIT 256
), dense AS MATERIALIZED (
    -- (in float8: the product of two small real components underflows,
    -- which PostgreSQL reports as an error rather than rounding to 0)
    SELECT e.turn_id AS id,
           (SELECT sum(x.a::float8 * x.b::float8) FROM unnest(e.embedding, $9::real[]) AS x(a, b)) AS cosine
    FROM turn_embeddings e
    WHERE $9::real[] IS NOT NULL AND $3::int > 0 AND e.user_id = $1::uuid AND e.model = $10::text
), span AS (
    SELECT min(d.cosine) AS lo, greatest(max(d.cosine) - min(d.cosine), 1e-9) AS width FROM dense d
), near AS (
    SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search
    FROM (SELECT d.id FROM dense d ORDER BY d.cosine DESC LIMIT 100) d
    JOIN raw_logs r ON r.id = d.id AND r.user_id = $1::uuid
    WHERE r.request_id IS DISTINCT FROM $8::uuid
), candidates AS (
    SELECT DISTINCT ON (u.id) u.*
    FROM (SELECT * FROM rare UNION ALL SELECT * FROM common UNION ALL SELECT * FROM near) u
), scored AS (
    -- A candidate's BM25 score: the idf of the query lexemes it holds, over
    -- its length term (1 + k1 (1 − b + b · length / 13) = 1.3 + 0.9 · length / 13),
    -- in float8. Summed per candidate rather than grouped: a GROUP BY had
    -- to sort the candidates with their tsvectors (BENCHMARKS.md, session 7).
    SELECT c.id, c.thread_id, c.user_seq, c.created_at,
           coalesce((SELECT sum(w.idf_turn) FROM w WHERE c.search @@ w.tq), 0) * 2.2::float8
               / (1.3::float8 + 0.9::float8 * length(c.search) / 13) AS bm25
    FROM candidates c
), hits AS (
    SELECT s.id, s.thread_id, s.user_seq, s.created_at,
           CASE WHEN $9::real[] IS NULL THEN s.bm25
                ELSE (1 - $11::float8) * s.bm25 / greatest(max(s.bm25) OVER (), 1e-9)
                     + $11::float8 * coalesce((d.cosine - span.lo) / span.width, 0)
           END AS score
    FROM scored s
    CROSS JOIN span
    LEFT JOIN dense d ON d.id = s.id
    ORDER BY score DESC, s.created_at DESC, s.id DESC
    LIMIT $3::int
), ranked AS (
    SELECT h.*, row_number() OVER (ORDER BY h.score DESC, h.created_at DESC, h.id DESC) AS rank
    FROM hits h
), turns AS (
    SELECT DISTINCT ON (t.id)
           'turn'::text AS kind, t.id,
           CASE WHEN t.id = k.id THEN 'hit' ELSE 'neighbour' END AS why,
           k.id AS hit_id, k.rank, k.score,
           abs(t.user_seq - k.user_seq) AS distance,
           t.thread_id, t.message_type, t.content, t.created_at, NULL::timestamptz AS period_end
    FROM ranked k
    -- A lateral lookup per hit (raw_logs_user_seq_idx), never a pass over
    -- the user's whole history.
    CROSS JOIN LATERAL (
        SELECT n.id, n.user_seq, n.thread_id, n.message_type, n.content, n.created_at
        FROM raw_logs n
        WHERE n.user_id = $1::uuid
          AND n.user_seq BETWEEN k.user_seq - $4::int AND k.user_seq + $4::int
          AND n.thread_id IS NOT DISTINCT FROM k.thread_id
          AND n.request_id IS DISTINCT FROM $8::uuid
        -- (a window holds at most this many; the LIMIT also keeps the
        -- planner from flattening the lookup into a join)
        LIMIT 2 * $4::int + 1
    ) t
    ORDER BY t.id, k.rank, abs(t.user_seq - k.user_seq)
), records AS (
    SELECT 'record'::text AS kind, s.id, 'record'::text AS why, s.id AS hit_id, NULL::bigint AS rank,
           sum(w.idf_record * (coalesce(array_length(x.positions, 1), 1) * 2.2)
               / (coalesce(array_length(x.positions, 1), 1)
                  + 1.2 * (0.25 + 0.75 * length(s.search) / 13.0))) AS score,
           0::bigint AS distance,
           NULL::uuid AS thread_id, NULL::text AS message_type, s.summary AS content,
           s.time_bucket_start AS created_at, s.time_bucket_end AS period_end
    FROM anyq
    JOIN lsm_storage s ON s.user_id = $1::uuid AND s.search @@ anyq.tq
    CROSS JOIN LATERAL unnest(s.search) AS x
    JOIN w ON w.lexeme = x.lexeme
    WHERE $5::int > 0
    GROUP BY s.id
    ORDER BY score DESC, s.time_bucket_start DESC
    LIMIT $5::int
), thread AS (
    SELECT 'turn'::text AS kind, t.id, 'thread'::text AS why, t.id AS hit_id, NULL::bigint AS rank,
           0::float8 AS score, 0::bigint AS distance,
           t.thread_id, t.message_type, t.content, t.created_at, NULL::timestamptz AS period_end
    FROM raw_logs t
    WHERE $6::uuid IS NOT NULL AND t.user_id = $1::uuid AND t.thread_id = $6::uuid
      AND t.request_id IS DISTINCT FROM $8::uuid
    ORDER BY t.user_seq DESC
    LIMIT $7::int
)
SELECT kind, id, why, hit_id, score, thread_id, message_type, content, created_at, period_end
FROM (SELECT 0 AS part, * FROM thread
      UNION ALL SELECT 1, * FROM turns
      UNION ALL SELECT 1, * FROM records) items
ORDER BY part, score DESC, hit_id DESC, distance, created_at
