-- Deletes user $1's archive mark (its memory version and high-water mark),
-- and takes the user out of the archive runs that name it. $2 bounds the
-- runs changed per call.
WITH mark AS (
    DELETE FROM archive_marks WHERE user_id = $1 RETURNING user_id
),
runs AS (
    UPDATE archive_runs a
    SET only_user = CASE WHEN a.only_user = $1 THEN NULL ELSE a.only_user END,
        errors = (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]')
                  FROM jsonb_array_elements(a.errors) WITH ORDINALITY AS x(e, n)
                  WHERE e ->> 'user_id' IS DISTINCT FROM $1::uuid::text)
    WHERE a.id IN (SELECT id FROM archive_runs
                   WHERE only_user = $1
                      OR errors @> jsonb_build_array(jsonb_build_object('user_id', $1::uuid::text))
                   LIMIT $2)
    RETURNING a.id
)
SELECT (SELECT count(*) FROM mark) + (SELECT count(*) FROM runs) AS deleted
