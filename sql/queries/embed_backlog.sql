-- What the embedder has yet to embed with model $1, for `maasctl doctor`:
-- the users with turns past their mark (all their turns when the mark was
-- made with another model), and how many turns that is (by sequence
-- number: a turn deleted meanwhile still counts). One pass over
-- archive_marks, one row per user with memory.
-- $1 model
SELECT count(*) AS users, coalesce(sum(b.turns), 0)::bigint AS turns
FROM (
    SELECT CASE WHEN m.embedded_model IS DISTINCT FROM $1::text THEN m.logged_seq
                ELSE m.logged_seq - m.embedded_seq END AS turns
    FROM archive_marks m
    WHERE m.logged_seq > m.embedded_seq OR m.embedded_model IS DISTINCT FROM $1::text
) b
WHERE b.turns > 0
