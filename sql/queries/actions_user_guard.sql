-- Passes the erase guard of user $1's bucket before an operator action
-- about the user is recorded, in the caller's transaction (as the guard
-- triggers of sql/0010_user_data.sql do for turns and records): a forget
-- that begins later waits for this transaction (users_forget_barrier)
-- and then erases the row it writes.
-- $1 user_id
SELECT pg_advisory_xact_lock_shared(maas_user_erase_key($1)) IS NULL AS passed
