-- Logs the turns of a conversation a client sent (the earlier messages of
-- an OpenAI-style `messages` list) that thread $2 of user $1 does not hold
-- yet: each (message_type, content) that is not already a turn of the
-- thread is inserted, in the order given, as a producer's INSERT would be
-- (the triggers number it and drop it for a forgotten user). A turn maas
-- logged itself (an earlier request's query and answer) is recognised and
-- not logged twice. Returns how many turns were logged.
-- $1 user_id (stored)
-- $2 thread_id
-- $3 message types (`user_query`, `assistant_response`), in order
-- $4 contents, in the same order
WITH given AS (
    SELECT g.message_type, g.content, g.n
    FROM unnest($3::text[], $4::text[]) WITH ORDINALITY AS g (message_type, content, n)
), missing AS (
    SELECT g.message_type, g.content, g.n
    FROM given g
    WHERE NOT EXISTS (
        SELECT 1 FROM raw_logs r
        WHERE r.user_id = $1 AND r.thread_id = $2
          AND r.message_type = g.message_type AND r.content = g.content
    )
), logged AS (
    INSERT INTO raw_logs (user_id, thread_id, message_type, content)
    SELECT $1, $2, m.message_type, m.content FROM missing m ORDER BY m.n
    RETURNING 1
)
SELECT count(*)::bigint AS logged FROM logged
