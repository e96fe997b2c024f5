-- Sends payload $2 on channel $1 (`maasctl doctor`'s round trip).
SELECT pg_notify($1, $2)
