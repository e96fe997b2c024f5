-- Reviewing an answer (sql/queries/review_request.sql): each verdict joins
-- the audit trail's list ('review_approve', 'review_edit' with the
-- original answer in its detail, 'review_reject'), added to whatever the
-- constraint lists now, as 0032 does. The rows name the request (run_id,
-- deleted with it) and its stored user (detail.user_id, erased with the
-- user's data: sql/queries/users_erase_actions.sql).
DO $$
DECLARE def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def
    FROM pg_constraint
    WHERE conname = 'operator_actions_action_valid' AND conrelid = 'operator_actions'::regclass;
    IF def IS NOT NULL AND position('review_approve' IN def) = 0 THEN
        EXECUTE 'ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_valid';
        EXECUTE 'ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_valid '
            || replace(def, 'ARRAY[', 'ARRAY[''review_approve''::text, ''review_edit''::text, ''review_reject''::text, ');
    END IF;
END
$$;

-- The waiting requests by status, for the metrics' gauges (requests
-- waiting by kind, waits past their limit) and the console's list filter:
-- only the rows that wait are in it, so a request that never waits never
-- writes to it.
CREATE INDEX IF NOT EXISTS pipeline_runs_waiting_idx ON pipeline_runs (status, updated_at)
    WHERE status IN ('WAITING_USER_INPUT', 'AWAITING_REVIEW');
