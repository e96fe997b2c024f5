-- The user's reply $3 to request $1 of tenant $2 (maas_reply,
-- sql/0037_person_in_the_loop.sql: the same function the SQL door's
-- trigger applies). `was`: the status the request was in
-- (WAITING_USER_INPUT: applied); NULL: no such request of that tenant.
SELECT maas_reply($1::uuid, $2::uuid, $3::text) AS was
