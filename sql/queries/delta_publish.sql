-- Writes one batch of a streamed answer's pieces: rows $3 (seq) / $4 (text,
-- NULL for a restart) of attempt $2 of request $1, in one statement with
-- their notifications on `answer_deltas` (docs/architecture.md, "Answers
-- that stream"). A notification carries the piece's text when the whole
-- payload fits in $5 bytes (below the server's 8,000), else only where to
-- read it (`id`, `attempt`, `seq`); a listener that gets no text reads the
-- row. Notifications go out in `seq` order at commit.
WITH ins AS (
    INSERT INTO answer_deltas (request_id, attempt, seq, text)
    SELECT $1, $2, d.seq, d.text
    FROM unnest($3::int4[], $4::text[]) AS d(seq, text)
    ON CONFLICT (request_id, attempt, seq) DO NOTHING
    RETURNING request_id, attempt, seq, text
),
sent AS (
    SELECT pg_notify('answer_deltas',
                     CASE WHEN octet_length(p.full_payload) <= $5 THEN p.full_payload
                          ELSE json_build_object('id', p.request_id, 'attempt', p.attempt, 'seq', p.seq,
                                                 'restart', p.text IS NULL)::text
                     END)
    FROM (SELECT i.request_id, i.attempt, i.seq, i.text,
                 json_build_object('id', i.request_id, 'attempt', i.attempt, 'seq', i.seq,
                                   'restart', i.text IS NULL, 'text', i.text)::text AS full_payload
          FROM ins i
          ORDER BY i.seq) p
)
SELECT count(*) AS notified FROM sent
