-- Answers that stream. A request asks for its answer's pieces while the
-- model writes (`stream`, false unless the client asks: a plain INSERT that
-- does not name it pays nothing). The daemon running the respond stage
-- writes the pieces in batches to `answer_deltas` and rings the
-- `answer_deltas` channel (docs/architecture.md, "Answers that stream").
--
-- `answer_deltas` is UNLOGGED: its rows are only for clients that reconnect
-- while an answer is written (the terminal state always carries the whole
-- answer), so they cost no WAL, and a crash of the server that empties the
-- table loses nothing a client needs. A row is one batch of one attempt of
-- the respond stage: `seq` counts from 1 within the attempt; `text` is the
-- text that follows the previous row's, or NULL for a restart (the model
-- call began again within the attempt: what came before is void). The
-- publisher deletes its request's rows shortly after its attempt ends; the
-- next batch of any request deletes rows older than an hour (`created_at`)
-- that a daemon which died left behind.
ALTER TABLE pipeline_runs ADD COLUMN stream boolean NOT NULL DEFAULT false;

CREATE UNLOGGED TABLE answer_deltas (
    request_id uuid        NOT NULL,
    attempt    int4        NOT NULL,
    seq        int4        NOT NULL,
    text       text,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, attempt, seq),
    CONSTRAINT answer_deltas_seq_positive CHECK (seq > 0 AND attempt > 0)
);

CREATE INDEX answer_deltas_created_at ON answer_deltas (created_at);
