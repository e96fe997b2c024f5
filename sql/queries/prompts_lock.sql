-- Serialises prompt changes of role $1 until the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('maas.system_prompts.' || $1::text))
