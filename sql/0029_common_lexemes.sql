-- The full-text part of a large user's memory search looks up each query
-- lexeme in the user's GIN entries (sql/queries/memory_search.sql): for a
-- lexeme in thousands of the user's turns the bitmap of them all is built
-- to keep 256 (about 1.7 ms a lexeme at 100,000 turns, most of the
-- statement's full-text time). Such a lexeme counts only as "common" (the
-- idf of 256, no candidates of its own), which needs no lookup when it is
-- known. Here a large user's common lexemes: those in at least 256 of its
-- turns, counted by the embedder service from the user's own turns
-- (memory_common_lexemes.sql; never another user's, invariant 7) when the
-- user has 5,000 logged turns, and again each time it has doubled since.
-- The search skips the lookup of a lexeme listed here and scores it as
-- before, so its hits are the ones it found without the list (tested in
-- tests/it/memory_scale.rs). A lexeme that becomes common after a count is
-- looked up as before until the next one; a lexeme whose turns were
-- deleted below 256 since is scored as common until then. Forgetting a
-- user deletes its mark and these rows with it (ON DELETE CASCADE).

-- The user's common lexemes and the turns each was in when counted.
CREATE TABLE common_lexemes (
    user_id uuid   NOT NULL REFERENCES archive_marks (user_id) ON DELETE CASCADE,
    lexeme  text   NOT NULL,
    turns   bigint NOT NULL CHECK (turns >= 256),
    PRIMARY KEY (user_id, lexeme)
);

-- When each user's lexemes were last counted: its logged turns then.
CREATE TABLE common_lexemes_counted (
    user_id uuid        NOT NULL PRIMARY KEY REFERENCES archive_marks (user_id) ON DELETE CASCADE,
    turns   bigint      NOT NULL,
    counted_at timestamptz NOT NULL DEFAULT now()
);
