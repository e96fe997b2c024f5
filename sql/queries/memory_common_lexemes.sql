-- Counts user $1's common lexemes (sql/0029_common_lexemes.sql) when it
-- is due: the user has at least $3 logged turns ($2, its count now) and
-- was never counted or has doubled since. One statement: the lexemes in at
-- least 256 of the user's turns (ts_stat over its own rows, through
-- raw_logs_user_seq_idx), stored or updated, those no longer common
-- deleted, the count recorded. Not due: nothing is read or written.
--
-- $1 user_id (uuid), $2 logged turns (int8), $3 least turns to count (int8)
--
-- Returns one row: lexemes (the common lexemes stored; 0 when not due).
WITH due AS (
    SELECT 1 AS due
    FROM archive_marks m
    WHERE m.user_id = $1::uuid AND $2::int8 >= $3::int8
      AND NOT EXISTS (SELECT 1 FROM common_lexemes_counted c
                      WHERE c.user_id = $1::uuid AND $2::int8 < 2 * c.turns)
), counted AS (
    SELECT s.word AS lexeme, s.ndoc::int8 AS turns
    FROM ts_stat(format('SELECT r.search FROM raw_logs r WHERE r.user_id = %L', $1::uuid)) s
    WHERE EXISTS (SELECT 1 FROM due) AND s.ndoc >= 256
), stored AS (
    INSERT INTO common_lexemes (user_id, lexeme, turns)
    SELECT $1::uuid, c.lexeme, c.turns FROM counted c
    ON CONFLICT (user_id, lexeme) DO UPDATE SET turns = EXCLUDED.turns
    RETURNING 1
), dropped AS (
    DELETE FROM common_lexemes l
    WHERE EXISTS (SELECT 1 FROM due) AND l.user_id = $1::uuid
      AND l.lexeme NOT IN (SELECT c.lexeme FROM counted c)
), marked AS (
    INSERT INTO common_lexemes_counted (user_id, turns)
    SELECT $1::uuid, $2::int8 FROM due
    ON CONFLICT (user_id) DO UPDATE SET turns = EXCLUDED.turns, counted_at = now()
)
SELECT count(*)::int8 AS lexemes FROM stored
