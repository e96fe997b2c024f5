-- The operator console: an operator's "archive now" on a user's
-- memory page is recorded in operator_actions as 'archive_run' (detail
-- names the user, so the user's view and the erase find it). The allowed
-- actions are extended, not restated, so actions added by other migrations
-- stay allowed.
DO $$
DECLARE
    def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def
    FROM pg_constraint
    WHERE conname = 'operator_actions_action_valid' AND conrelid = 'operator_actions'::regclass;
    IF def IS NOT NULL AND position('archive_run' IN def) = 0 THEN
        EXECUTE 'ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_action_valid';
        EXECUTE 'ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_action_valid '
            || replace(def, 'ARRAY[', 'ARRAY[''archive_run''::text, ');
    END IF;
END
$$;

-- The overview's charts and per-model lines read the last hour of stage
-- attempts by the time they finished. Steps are appended in about that
-- order, so a BRIN index finds the last hour in a few block ranges at a
-- tiny cost per insert (a b-tree would cost every attempt's insert).
CREATE INDEX pipeline_steps_finished_brin ON pipeline_steps USING brin (finished_at) WITH (pages_per_range = 16);
