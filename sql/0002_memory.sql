-- Chat logs, long-term memory and the prompts of each role.

CREATE TABLE raw_logs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id      uuid        NOT NULL,
    request_id   uuid,
    thread_id    uuid,
    message_type text        NOT NULL,
    content      text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT raw_logs_message_type_valid CHECK (message_type IN ('user_query', 'assistant_response'))
);
-- Each request logs its query and its answer exactly once.
CREATE UNIQUE INDEX raw_logs_request_message_idx ON raw_logs (request_id, message_type)
    WHERE request_id IS NOT NULL;
CREATE INDEX raw_logs_user_idx ON raw_logs (user_id, id);

-- Long-term memory. Invariant 7: every record belongs to exactly one user.
CREATE TABLE lsm_storage (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id           uuid        NOT NULL,
    time_bucket_start timestamptz NOT NULL,
    time_bucket_end   timestamptz NOT NULL,
    tags              text[]      NOT NULL DEFAULT '{}',
    summary           text        NOT NULL,
    raw_log_ids       bigint[]    NOT NULL DEFAULT '{}',
    created_at        timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT lsm_storage_bucket_order CHECK (time_bucket_start <= time_bucket_end)
);
CREATE INDEX lsm_storage_user_idx ON lsm_storage (user_id, time_bucket_start DESC);

CREATE TABLE system_prompts (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role_name       text        NOT NULL,
    version         integer     NOT NULL DEFAULT 1,
    prompt_template text        NOT NULL,
    is_active       boolean     NOT NULL DEFAULT true,
    created_at      timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT system_prompts_role_valid CHECK (role_name IN ('Analyzer', 'Assembler', 'FinalResponder', 'Archivist')),
    CONSTRAINT system_prompts_role_version_key UNIQUE (role_name, version)
);
-- At most one active prompt per role.
CREATE UNIQUE INDEX system_prompts_active_idx ON system_prompts (role_name) WHERE is_active;

INSERT INTO system_prompts (role_name, prompt_template) VALUES
('Analyzer', $prompt$You are the analyzer of a memory service. You receive the user's query and a list of summaries of the user's earlier conversations (LSM records, each with an id, a period, tags and a summary). Decide whether answering needs that history.
Reply with one JSON object and nothing else:
{"needs_context": true|false,
 "context_type": "none" | "recent" | "topic" | "period",
 "time_scope": "a short description of the period the query refers to, or \"none\"",
 "search_keywords": ["keyword", ...],
 "context_found": {"lsm_record_id": <id of the most relevant record, or null>, "period": "<its period, or null>", "relevance": <0..1>}}$prompt$),
('Assembler', $prompt$Below is context from the user's earlier conversations. Use it only where it helps answer the current query.$prompt$),
('FinalResponder', $prompt$You are a helpful assistant with long-term memory of this user. Answer the current query. When a history block is present, use it where relevant and do not invent facts that are not in it.$prompt$),
('Archivist', $prompt$You are the archivist of a memory service. You receive one conversation of one user (messages with their time). Summarise what is worth remembering.
Reply with one JSON object and nothing else:
{"time_bucket_start": "<RFC 3339 time of the first message>",
 "time_bucket_end": "<RFC 3339 time of the last message>",
 "tags": ["topic", ...],
 "summary": "what the user asked, decided or revealed, in a few sentences"}$prompt$);
