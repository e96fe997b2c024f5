-- Changes the person-in-the-loop settings of tenant $1 (name) on behalf
-- of $10 and records the action (sql/0037_person_in_the_loop.sql): NULL
-- leaves each as it is, except the timeouts, set when $4 (and $6) say so
-- to $5 (and $7) seconds, NULL clearing them (no limit). No row: unknown
-- tenant. A policy other than 'answer' or 'fail' is refused by the
-- table's constraint, naming it.
WITH changed AS (
    UPDATE tenants
    SET hitl_clarify       = coalesce($2::bool, hitl_clarify),
        hitl_review        = coalesce($3::bool, hitl_review),
        user_reply_timeout = CASE WHEN $4::bool THEN make_interval(secs => $5::float8) ELSE user_reply_timeout END,
        review_timeout     = CASE WHEN $6::bool THEN make_interval(secs => $7::float8) ELSE review_timeout END,
        on_reply_timeout   = coalesce($8::text, on_reply_timeout),
        on_review_timeout  = coalesce($9::text, on_review_timeout)
    WHERE name = $1
    RETURNING name, hitl_clarify, hitl_review,
              extract(epoch FROM user_reply_timeout)::float8 AS user_reply_timeout_secs,
              extract(epoch FROM review_timeout)::float8 AS review_timeout_secs,
              on_reply_timeout, on_review_timeout
),
audit AS (
    INSERT INTO operator_actions (action, actor, detail)
    SELECT 'tenant_set', $10::text, to_jsonb(c) FROM changed c
)
SELECT * FROM changed
