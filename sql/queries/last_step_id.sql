-- Where the metrics' reading of the step history starts: the newest step.
SELECT coalesce(max(id), 0)::int8 FROM pipeline_steps
