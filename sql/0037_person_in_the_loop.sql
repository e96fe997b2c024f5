-- A person in the loop: a request may wait for its user's reply to a
-- question (WAITING_USER_INPUT) or for an operator's review of its answer
-- (AWAITING_REVIEW). A wait is only a row: it holds no lease (neither
-- status is in pipeline_runs_lease_matches_status's list), no connection
-- and no daemon; no claim, ring or reclaim reads it (none of them lists
-- it), and the sweep ends it when `wait_expires_at` passes
-- (sql/queries/expire_waits.sql). Both are off unless a tenant or a
-- request turns them on, so a producer that inserts and waits for
-- COMPLETED never sees a request wait.

ALTER TABLE pipeline_runs DROP CONSTRAINT pipeline_runs_status_valid;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_status_valid CHECK (status IN (
    'NEW', 'ANALYZING', 'ANALYZED', 'ASSEMBLING', 'READY', 'RESPONDING',
    'WAITING_USER_INPUT', 'AWAITING_REVIEW', 'COMPLETED', 'FAILED', 'CANCELLED'));

-- Per request: `clarify` NULL takes the tenant's setting
-- (tenants.hitl_clarify), true or false overrides it; `review` true asks
-- for an operator's review, NULL or false leaves it to tenants.hitl_review
-- (a request cannot turn its tenant's review off). A producer sets them
-- in its INSERT like any other column.
-- `question`: the question the request waits on, while it waits
-- (WAITING_USER_INPUT exactly when there is one). `wait_expires_at`: when
-- the current wait ends by itself; NULL when not waiting, or waiting
-- without a limit.
ALTER TABLE pipeline_runs
    ADD COLUMN clarify         boolean,
    ADD COLUMN review          boolean,
    ADD COLUMN question        text,
    ADD COLUMN wait_expires_at timestamptz,
    ADD CONSTRAINT pipeline_runs_question_while_waiting CHECK (
        (status = 'WAITING_USER_INPUT') = (question IS NOT NULL)),
    ADD CONSTRAINT pipeline_runs_wait_expires_while_waiting CHECK (
        wait_expires_at IS NULL OR status IN ('WAITING_USER_INPUT', 'AWAITING_REVIEW')),
    ADD CONSTRAINT pipeline_runs_question_size CHECK (length(question) <= 100000);

-- The sweep's expiries: the waits with a limit, soonest first. Holds the
-- waiting rows only; a row that never waits never writes to it.
CREATE INDEX pipeline_runs_wait_idx ON pipeline_runs (wait_expires_at)
    WHERE wait_expires_at IS NOT NULL;

-- Per tenant (`maasctl tenants set`): whether its requests may ask their
-- user (hitl_clarify) and need an operator's review (hitl_review); how
-- long each wait lasts (NULL: until answered or cancelled) and what its
-- expiry does: 'answer' goes on without the person (a request that asked
-- is analyzed again, told that the user did not reply; an answer under
-- review is delivered as it is), 'fail' fails the request naming the
-- limit.
ALTER TABLE tenants
    ADD COLUMN hitl_clarify       boolean  NOT NULL DEFAULT false,
    ADD COLUMN hitl_review        boolean  NOT NULL DEFAULT false,
    ADD COLUMN user_reply_timeout interval,
    ADD COLUMN review_timeout     interval,
    ADD COLUMN on_reply_timeout   text     NOT NULL DEFAULT 'answer',
    ADD COLUMN on_review_timeout  text     NOT NULL DEFAULT 'fail',
    ADD CONSTRAINT tenants_on_reply_timeout_valid CHECK (on_reply_timeout IN ('answer', 'fail')),
    ADD CONSTRAINT tenants_on_review_timeout_valid CHECK (on_review_timeout IN ('answer', 'fail')),
    ADD CONSTRAINT tenants_timeouts_positive CHECK (
        (user_reply_timeout IS NULL OR user_reply_timeout > interval '0')
        AND (review_timeout IS NULL OR review_timeout > interval '0'));

-- The exchange of a request that asked: the question (the assistant's
-- turn) and the reply (the user's), each logged once per request by the
-- unique index on (request_id, message_type), as the query and the answer
-- are.
ALTER TABLE raw_logs DROP CONSTRAINT raw_logs_message_type_valid;
ALTER TABLE raw_logs ADD CONSTRAINT raw_logs_message_type_valid CHECK (message_type IN (
    'user_query', 'assistant_response', 'assistant_question', 'user_reply'));

-- A producer reads the question of its requests (and until when it may
-- reply) where it reads their status. Columns are added at the end, as
-- CREATE OR REPLACE VIEW requires.
CREATE OR REPLACE VIEW maas_my_requests WITH (security_barrier) AS
SELECT r.id,
       coalesce(r.tenant_user_id, r.user_id) AS user_id,
       r.thread_id,
       r.user_query,
       r.status,
       r.final_answer,
       r.error,
       r.metadata,
       r.created_at,
       r.updated_at,
       r.question,
       r.wait_expires_at
FROM pipeline_runs r
WHERE r.tenant_id = (SELECT maas_role_tenant(current_user));

-- The user's reply to the question request `run` of tenant `tenant` waits
-- on: one path for every door (the HTTP API and maasctl call it through
-- sql/queries/reply.sql; the SQL door's trigger below calls it). In one
-- statement's transaction: the request goes back to the analyzer (NEW, due
-- now) with its question and wait cleared, and the reply is logged as the
-- user's turn of the thread, once per request. Guarded by the status: of
-- two replies at once, the second finds the row no longer waiting (it
-- waits for the first's lock, then reads the row again). Returns the
-- status the request was in: 'WAITING_USER_INPUT' when the reply was
-- applied, any other status when it was not; NULL when there is no such
-- request of that tenant. A reply that is empty or over 100,000
-- characters is refused, naming the limit.
CREATE FUNCTION maas_reply(run uuid, tenant uuid, reply text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    asker record;
BEGIN
    IF reply IS NULL OR btrim(reply) = '' THEN
        RAISE EXCEPTION 'the reply to request % is empty', run
            USING ERRCODE = '22023', COLUMN = 'text', HINT = 'send the user''s reply as non-empty text';
    END IF;
    IF length(reply) > 100000 THEN
        RAISE EXCEPTION 'the reply to request % has % characters, over the limit of 100000', run, length(reply)
            USING ERRCODE = '22001', COLUMN = 'text';
    END IF;
    UPDATE pipeline_runs p
    SET status          = 'NEW',
        question        = NULL,
        wait_expires_at = NULL,
        attempt         = 0,
        run_after       = now(),
        updated_at      = now()
    WHERE p.id = run AND p.tenant_id = tenant AND p.status = 'WAITING_USER_INPUT'
    RETURNING p.user_id, p.thread_id INTO asker;
    IF FOUND THEN
        INSERT INTO raw_logs (user_id, request_id, thread_id, message_type, content)
        VALUES (asker.user_id, run, asker.thread_id, 'user_reply', reply)
        ON CONFLICT (request_id, message_type) WHERE request_id IS NOT NULL DO NOTHING;
        RETURN 'WAITING_USER_INPUT';
    END IF;
    RETURN (SELECT p.status FROM pipeline_runs p WHERE p.id = run AND p.tenant_id = tenant);
END
$$;

-- The SQL door for replies: a producer role answers its request's
-- question with `INSERT INTO pipeline_replies (run_id, text) VALUES (…)`
-- (grant it INSERT on the table; docs/deploying.md, "Producer roles").
-- The insert applies the reply through maas_reply, or fails saying why: no
-- such request of the role's tenant, or the status it is in. The tenant is
-- the inserting role's, by the rules of pipeline_runs
-- (triggers/0006_assign_tenant.sql): a role mapped to no tenant replies to
-- nothing; a trusted role (one that may UPDATE pipeline_runs) replies for
-- the request's own tenant. The row is deleted once applied: the reply
-- lives on as the user's turn in raw_logs, which retention, forget and
-- export cover; the table holds nothing.
CREATE TABLE pipeline_replies (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     uuid        NOT NULL,
    text       text        NOT NULL,
    tenant_id  uuid        NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Runs as the inserting role: its tenant, which it cannot choose.
CREATE FUNCTION assign_reply_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF has_table_privilege('pipeline_runs'::regclass, 'UPDATE') THEN
        NEW.tenant_id := coalesce((SELECT p.tenant_id FROM pipeline_runs p WHERE p.id = NEW.run_id), NEW.tenant_id);
    ELSE
        NEW.tenant_id := producer_tenant(TG_TABLE_NAME);
    END IF;
    RETURN NEW;
END
$$;

-- Runs as its owner (a producer holds INSERT on pipeline_replies alone):
-- applies the reply for the tenant the row names, or refuses it.
CREATE FUNCTION apply_reply() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    was text := maas_reply(NEW.run_id, NEW.tenant_id, NEW.text);
BEGIN
    IF was IS NULL THEN
        RAISE EXCEPTION 'request % is not a request of this role''s tenant', NEW.run_id
            USING ERRCODE = 'P0002', COLUMN = 'run_id', TABLE = TG_TABLE_NAME;
    ELSIF was <> 'WAITING_USER_INPUT' THEN
        RAISE EXCEPTION 'request % is %, not WAITING_USER_INPUT: it takes a reply only while it waits for one', NEW.run_id, was
            USING ERRCODE = '55000', COLUMN = 'run_id', TABLE = TG_TABLE_NAME;
    END IF;
    DELETE FROM pipeline_replies WHERE id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER pipeline_replies_assign_tenant
    BEFORE INSERT ON pipeline_replies
    FOR EACH ROW EXECUTE FUNCTION assign_reply_tenant();
CREATE TRIGGER pipeline_replies_apply
    AFTER INSERT ON pipeline_replies
    FOR EACH ROW EXECUTE FUNCTION apply_reply();

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION maas_reply(uuid, uuid, text) SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION assign_reply_tenant() SET search_path = pg_catalog, %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION apply_reply() SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;

-- The Analyzer prompt learns to ask. Its input says `"may_ask_user": true`
-- where the request may ask its user (src/stage/analyzer.rs), and carries
-- `clarification` for a request that asked already. Installed as the next
-- version and activated only while the version 0021 installed is still the
-- active one and nobody added a version since: an operator's own prompt
-- stays (and asks nothing until it says how).
DO $migration$
DECLARE
    v3 constant text := $prompt$You are the analyzer of a memory service. You receive the user's query, a list of summaries of the user's earlier conversations (LSM records, each with an id, a period, tags and a summary) and `earlier_turns`: how many messages the user has exchanged before this query, including those no record summarises yet. Decide whether answering needs that history.
Set needs_context to true when there are records that bear on the query, and also when earlier_turns is above 0 and the query could use what the user said before: a personal reference ("my", "our", "мой", "наш"…), a question about the past, or a person or thing it names. Then the user's earlier messages are searched with the query and your search_keywords. Set it to false for a self-contained question.
Only when the input says "may_ask_user": true, and the query cannot be answered or searched without knowing what the user means (it points at something it does not name, or could mean two different things), add "clarify": {"question": "<one short question to the user>"}; otherwise leave clarify out. When the input has "clarification", the user was asked that question already: use the reply (or, when it is null, do without it) and do not ask again.
Reply with one JSON object and nothing else:
{"needs_context": true|false,
 "context_type": "none" | "recent" | "topic" | "period",
 "time_scope": "a short description of the period the query refers to, or \"none\"",
 "search_keywords": ["keyword", ...],
 "context_found": {"lsm_record_id": <id of the most relevant record, or null>, "period": "<its period, or null>", "relevance": <0..1>},
 "clarify": {"question": "..."} (only when asking)}$prompt$;
BEGIN
    IF EXISTS (SELECT 1 FROM system_prompts
               WHERE role_name = 'Analyzer' AND version = 2 AND is_active
                 AND prompt_template LIKE 'You are the analyzer of a memory service. You receive the user''s query, a list of summaries%')
       AND NOT EXISTS (SELECT 1 FROM system_prompts WHERE role_name = 'Analyzer' AND version > 2) THEN
        UPDATE system_prompts SET is_active = false WHERE role_name = 'Analyzer' AND version = 2;
        INSERT INTO system_prompts (role_name, version, prompt_template) VALUES ('Analyzer', 3, v3);
    END IF;
END
$migration$;
