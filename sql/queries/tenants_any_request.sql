-- Whether any of the requests $2 is tenant $1's (the console's live events
-- of a session limited to one tenant).
SELECT EXISTS (SELECT FROM pipeline_runs WHERE id = ANY($2::uuid[]) AND tenant_id = $1) AS found
