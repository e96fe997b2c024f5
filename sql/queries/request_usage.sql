-- The model tokens request $1 of tenant $2 used, over every attempt of
-- every stage (what the pipeline paid for it): the `usage` of the
-- OpenAI-compatible endpoint's answer. A request of another tenant sums to
-- nothing.
-- $1 request id
-- $2 tenant_id
SELECT coalesce(sum(s.prompt_tokens), 0)::bigint AS prompt_tokens,
       coalesce(sum(s.completion_tokens), 0)::bigint AS completion_tokens
FROM pipeline_runs r
JOIN pipeline_steps s ON s.run_id = r.id
WHERE r.id = $1 AND r.tenant_id = $2
