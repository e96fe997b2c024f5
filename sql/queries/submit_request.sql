-- Inserts a request submitted over HTTP; the triggers ring the doorbell and
-- log the query, as for any other insert.
INSERT INTO pipeline_runs (user_id, thread_id, user_query, callback_url, debug, metadata)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id
