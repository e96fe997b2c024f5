-- The memory of one request, short-term and long-term, in one statement
-- (src/repo/memory.rs), written in parts: this file (the query's lexemes
-- and the full-text candidates), then memory_search_fulltext.sql (the
-- hits by full text alone) or memory_search_semantic.sql (the hits by full
-- text fused with embeddings, when they are on), then
-- memory_search_items.sql (the hits' neighbours, the records, the thread's
-- turns, and the rows in packing order). A statement is the
-- concatenation; the full-text one carries nothing of the semantic part. Every scan is filtered by the user (invariant 7)
-- and goes through an index that leads with user_id: the (user_id, search)
-- GIN indexes for the search, raw_logs_user_seq_idx for the neighbours,
-- raw_logs_thread_idx for the thread; another user's rows are never read.
-- The request's own turns (its query, logged on submit) are never returned.
--
-- $1 user_id (uuid)
-- $2 query (the request's query, plus the analysis' search_keywords; empty: no long-term search)
-- $3 hits (most matching turns, e.g. 40; 0: no long-term turns)
-- $4 window (same-thread neighbours each side of each of the five strongest hits; 2 measured best)
-- $5 records (most matching records; 0 for none)
-- $6 thread_id (the request's thread; NULL: no short-term turns)
-- $7 thread_turns (newest turns of that thread)
-- $8 request_id (the request itself, whose turns are left out)
-- $9 first_person (the query speaks of its user as "I", "my", "я", "мой":
--    the user's own turns score as a named speaker's; stage::memory::first_person)
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
-- Speakers: a turn's speaker is its `Name: ` prefix, read as the
-- assembler reads it (a name of at most three words starting with a
-- letter, within the turn's first 42 characters); other turns have none.
-- A question that names a speaker (a lexeme of the name is one of the
-- query's: "What did Caroline paint?") asks mostly about that person's own
-- words (on LoCoMo's development half, 94 % of the questions naming one
-- speaker have every evidence turn said by that speaker), so a candidate
-- said by a named speaker scores more: + 0.15 on the fused score's 0 to 1
-- scale (fitted with the semantic weight, leave one conversation out:
-- BENCHMARKS.md, session 27), + 0.1 × the best BM25 score with full text
-- alone (chosen, not fitted: the full-text path was not measured). Cost: a prefix match on the first 42
-- characters of each row the search reads anyway, and the lexemes of each
-- distinct speaker among the candidates; nothing on the insert path.
-- A question in the first person ($9: "What did I paint?", "Как зовут мою
-- собаку?") asks about the user's own words: the user's turns
-- (`user_query`) score as a named speaker's, the same 0.15 (not fitted
-- again). On LoCoMo's development half, the 327 questions naming only the
-- user's speaker, put in the first person, keep all their evidence in the
-- block for 0.835 of them without this and 0.847 with it, multi-hop 0.327
-- against 0.418 (the retrieval simulator); through the pipeline, in the
-- first person with it 0.859 against 0.838 as LoCoMo names them
-- (`MAAS_EVAL_MEMORY_FIRST_PERSON`; BENCHMARKS.md, session 30).
--
-- Bounded work, whatever the size of the user's history: one GIN lookup per
-- lexeme (none for a lexeme the user's `common_lexemes` lists) reads at
-- most 256 of its turns, which gives its document frequency
-- (a lexeme found that often is common — a speaker's name, "go", "like" —
-- and scores with the idf of 256) and, for the rarer lexemes, the
-- candidates themselves. A candidate is scored by testing each query lexeme
-- against its tsvector (`@@`), so common lexemes still add to the turns
-- that hold them. Only when fewer than 40 turns match a rarer lexeme are
-- the newest 256 turns matching any lexeme scored besides (among the
-- user's newest 4,096 turns: all of them for most users). On LoCoMo this
-- picks the same hits as scoring every matching turn (BENCHMARKS.md).
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
), known AS (
    -- The query's lexemes known to be common for the user (in at least
    -- 256 of its turns when counted: sql/0029_common_lexemes.sql): no
    -- lookup, the document frequency of 256 that the lookup would give.
    SELECT c.lexeme FROM common_lexemes c
    WHERE c.user_id = $1::uuid AND c.lexeme IN (SELECT q.lexeme FROM q)
), m AS MATERIALIZED (
    -- Each other lexeme's turns, at most 256 (one GIN lookup each), with
    -- their speakers (see "Speakers" above).
    SELECT q.lexeme, r.id, r.thread_id, r.user_seq, r.created_at, r.search, r.speaker, r.by_user, r.request_id
    FROM q
    CROSS JOIN LATERAL (
        SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search,
               substring(left(r.content, 42) from '^([[:alpha:]][[:alnum:]._-]*(?: +[[:alnum:]._-]+){0,2}): ') AS speaker,
               r.message_type = 'user_query' AS by_user, r.request_id
        FROM raw_logs r
        WHERE $3::int > 0 AND r.user_id = $1::uuid AND r.search @@ q.tq
        LIMIT 256) r
    WHERE q.lexeme NOT IN (SELECT k.lexeme FROM known k)
), df AS (
    -- Each lexeme's document frequency (up to 256), in one pass over m.
    SELECT m.lexeme, count(*)::float8 AS turns FROM m GROUP BY m.lexeme
    UNION ALL
    SELECT k.lexeme, 256::float8 FROM known k
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
    SELECT DISTINCT ON (m.id) m.id, m.thread_id, m.user_seq, m.created_at, m.search, m.speaker, m.by_user
    FROM m JOIN w ON w.lexeme = m.lexeme AND w.turns < 256
    WHERE m.request_id IS DISTINCT FROM $8::uuid
), common AS (
    -- (the user's newest turns walked backwards, at most 4,096: a bitmap
    -- of every turn matching any lexeme read 35,000 turns of a user of
    -- 100,000 to keep the newest 256)
    SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search, r.speaker, r.by_user
    FROM (SELECT r.id, r.thread_id, r.user_seq, r.created_at, r.search,
                 substring(left(r.content, 42) from '^([[:alpha:]][[:alnum:]._-]*(?: +[[:alnum:]._-]+){0,2}): ') AS speaker,
                 r.message_type = 'user_query' AS by_user, r.request_id
          FROM raw_logs r
          WHERE (SELECT count(*) FROM rare) < 40 AND r.user_id = $1::uuid
          ORDER BY r.user_seq DESC
          LIMIT 4096) r
    WHERE r.search @@ (SELECT anyq.tq FROM anyq)
      AND r.request_id IS DISTINCT FROM $8::uuid
    ORDER BY r.user_seq DESC
    LIMIT 256
