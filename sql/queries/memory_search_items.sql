-- Part 3 of the memory search (memory_search.sql): the hits' neighbours,
-- the records, the thread's turns, and the rows in packing order.
), ranked AS (
    -- Packing that prefers coverage: only the five strongest hits bring
    -- their neighbours; the others come as single turns, so the budget
    -- holds hits from more sessions instead of a few long windows
    -- (BENCHMARKS.md, session 26: 5 measured against 3).
    SELECT r.*, CASE WHEN r.rank <= 5 THEN $4::int ELSE 0 END AS reach
    FROM (SELECT h.*, row_number() OVER (ORDER BY h.score DESC, h.created_at DESC, h.id DESC) AS rank
          FROM hits h) r
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
          AND n.user_seq BETWEEN k.user_seq - k.reach AND k.user_seq + k.reach
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
