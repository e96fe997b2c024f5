-- Full-text search over a user's whole memory: turns (raw_logs) and
-- records (lsm_storage), for sql/queries/memory_search.sql.
--
-- The text search configuration `maas_memory` is the project's own, a copy
-- of the built-in `russian`: Latin-script words go through the English
-- Snowball stemmer with the English stop words, Cyrillic words through the
-- Russian stemmer and stop words, numbers and other tokens stay as they
-- are. Users write both (its first users write Russian); on English text it
-- produces exactly the lexemes of `english` (BENCHMARKS.md, "Memory
-- retrieval"). An operator with other languages changes the configuration
-- (`ALTER TEXT SEARCH CONFIGURATION maas_memory ...`) and then recomputes
-- the columns (`UPDATE raw_logs SET content = content`, likewise for
-- lsm_storage): a stored tsvector keeps the lexemes it was made with.
--
-- Invariant 7 by construction: the indexes lead with user_id (btree_gin
-- lets a GIN index hold the uuid), so a search of one user reads only that
-- user's index entries and rows. btree_gin is a contrib extension, trusted
-- since PostgreSQL 13 (a database owner may create it).
--
-- Cost: adding a stored generated column rewrites each table once, under
-- an ACCESS EXCLUSIVE lock; on a large installation run it in a quiet hour.

CREATE EXTENSION IF NOT EXISTS btree_gin;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_ts_config WHERE cfgname = 'maas_memory') THEN
        CREATE TEXT SEARCH CONFIGURATION maas_memory (COPY = pg_catalog.russian);
    END IF;
END
$$;

ALTER TABLE raw_logs
    ADD COLUMN search tsvector GENERATED ALWAYS AS (to_tsvector('maas_memory', content)) STORED;
CREATE INDEX raw_logs_search_idx ON raw_logs USING gin (user_id, search);

-- array_to_string is STABLE (it calls the element type's output function);
-- for text[] the result never changes, which makes this wrapper IMMUTABLE
-- and usable in a generated column.
CREATE OR REPLACE FUNCTION maas_tags_text(tags text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$ SELECT array_to_string(tags, ' ') $fn$;

ALTER TABLE lsm_storage
    ADD COLUMN search tsvector GENERATED ALWAYS AS (
        to_tsvector('maas_memory', summary) || to_tsvector('maas_memory', maas_tags_text(tags))
    ) STORED;
CREATE INDEX lsm_storage_search_idx ON lsm_storage USING gin (user_id, search);

-- Short-term memory: the newest turns of one thread of a user.
CREATE INDEX raw_logs_thread_idx ON raw_logs (user_id, thread_id, user_seq DESC) WHERE thread_id IS NOT NULL;

-- Provenance: which turns and records went into a request's context, with
-- their scores (a JSON array of {kind, id, score, why}); NULL before the
-- assemble stage, and for requests assembled before this migration.
ALTER TABLE pipeline_runs ADD COLUMN context_sources jsonb;
