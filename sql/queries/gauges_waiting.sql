-- Requests waiting for a person, by waiting status, and how many of them
-- have passed their limit (`wait_expires_at`) without a sweep ending them:
-- read from the partial index of waiting rows (pipeline_runs_waiting_idx,
-- sql/0038_review.sql), never the whole table.
SELECT status, count(*)::int8 AS n,
       count(*) FILTER (WHERE wait_expires_at < now())::int8 AS overdue
FROM pipeline_runs
WHERE status IN ('WAITING_USER_INPUT', 'AWAITING_REVIEW')
GROUP BY status
