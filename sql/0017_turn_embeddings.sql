-- Semantic memory search (optional; `[llm.embedding]`, off by default):
-- one embedding per turn, made by the embedder service of maasd from the
-- turn's text together with the text of the turn before it in its thread
-- (a reply is often meaningless alone: "Yes, in March!"), and compared in
-- sql/queries/memory_search.sql with the embedding of the request's query.
--
-- Stored as real[] (unit length, so the cosine is the dot product): plain
-- PostgreSQL, no extension. The search computes the cosine of every one of
-- the user's embeddings (through turn_embeddings_user_idx, never another
-- user's rows): about 21 ms for 680 turns of 384 dimensions
-- (BENCHMARKS.md, session 8).
--
-- A turn's embedding goes with the turn (ON DELETE CASCADE): deleting a
-- turn, retention, and forgetting a user delete it too. `model` names what
-- made it; the search reads only the configured model's, and a change of
-- model makes the embedder redo the user's turns.
CREATE TABLE turn_embeddings (
    turn_id   bigint PRIMARY KEY REFERENCES raw_logs (id) ON DELETE CASCADE,
    user_id   uuid   NOT NULL,
    model     text   NOT NULL,
    embedding real[] NOT NULL
);
CREATE INDEX turn_embeddings_user_idx ON turn_embeddings (user_id);

-- The embedder's per-user high-water mark, beside the archivist's: the
-- highest user_seq embedded, and with which model. user_seq is handed out
-- under the lock of this row (triggers/0004_track_raw_logs.sql), so a
-- user's turns commit in user_seq order and a mark never skips one. No
-- index and no CHECK: archive_marks is updated by every turn's insert, and
-- both would cost that path (an index on a changed column ends HOT updates).
ALTER TABLE archive_marks
    ADD COLUMN embedded_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN embedded_model text;
