-- The assembler's memory, in one place for every statement that claims a
-- row for the assemble stage (claim.sql, finish.sql when it chains): the
-- LSM record the analysis refers to, and only if it belongs to the same user
-- (invariant 7: a request only ever reads its own user's memory). NULL when
-- the analysis names no record, names one that is not a number, or names
-- another user's.
CREATE FUNCTION assembler_memory(owner uuid, analysis jsonb) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_agg(to_jsonb(m))
    FROM (SELECT l.id, l.time_bucket_start, l.time_bucket_end, l.tags, l.summary
          FROM lsm_storage l
          WHERE l.user_id = owner
            AND l.id = CASE
                           WHEN (analysis #>> '{context_found,lsm_record_id}') ~ '^[0-9]{1,18}$'
                           THEN (analysis #>> '{context_found,lsm_record_id}')::bigint
                       END) m
$$;
