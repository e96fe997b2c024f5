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

-- Per request: NULL takes the tenant's setting (tenants.hitl_clarify,
-- tenants.hitl_review); true or false overrides it. A producer sets them
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
