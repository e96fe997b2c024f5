-- Waits for the transactions that passed the guard of user $1's bucket
-- before its tombstone (they hold the bucket's lock, maas_user_erase_key,
-- sql/0010_user_data.sql); the lock is released when this transaction ends.
-- $1 user_id
SELECT pg_advisory_xact_lock(maas_user_erase_key($1)) IS NULL AS waited
