-- The operator console's overview: model calls of the last $1 seconds by
-- stage and model, from the stage attempts (every daemon's): attempts,
-- tokens, and attempts refused by the provider's rate limit. Reads
-- pipeline_steps_finished_brin.
SELECT stage, coalesce(model, '') AS model,
       count(*)::int8 AS calls,
       coalesce(sum(prompt_tokens), 0)::int8 AS prompt_tokens,
       coalesce(sum(completion_tokens), 0)::int8 AS completion_tokens,
       count(*) FILTER (WHERE error_class = 'rate_limited')::int8 AS rate_limited
FROM pipeline_steps
WHERE finished_at >= now() - make_interval(secs => $1::float8)
  AND (model IS NOT NULL OR error_class IS NOT NULL)
GROUP BY stage, coalesce(model, '')
ORDER BY stage, model
