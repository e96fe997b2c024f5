-- The doorbell's payload, `{"id": …, "status": …, "operation": …}` (and
-- `"passed": true` for a status a row passed through within one statement),
-- built by concatenation. json_build_object looked up each argument's type
-- and output function on every call: 3.5 % of PostgreSQL's CPU in a drain
-- of the benchmark (perf), where a request sends seven notifications. The
-- text is the same JSON object with the same keys in the same order.
--
-- No escaping is needed: the id is a uuid's text, the status is one of the
-- statuses `pipeline_runs_status_valid` allows, the operation one of the
-- callers' literals (INSERT, UPDATE, SWEEP, CONTINUE). A SQL function of one
-- expression: the planner inlines it, so no function call is made per row.
CREATE FUNCTION maas_event(id uuid, status text, operation text, passed boolean DEFAULT false)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{"id" : "' || id::text || '", "status" : "' || status || '", "operation" : "' || operation || '"'
       || CASE WHEN passed THEN ', "passed" : true}' ELSE '}' END;
