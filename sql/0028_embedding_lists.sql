-- The semantic search of a large user reads a fraction of its rows:
-- inverted lists (IVF). The code pass of sql/0024_embedding_codes.sql
-- still reads every code of the user: about 2 µs a turn, most of 200 ms at
-- 100,000 turns. Here each user above a size has centroids of its own,
-- trained by the embedder service from a sample of its own embeddings
-- (k-means, src/embedder/lists.rs; never another user's vectors:
-- invariant 7), and each of its turn embeddings the number of its nearest
-- centroid (`list`). The search (sql/queries/memory_search_semantic.sql)
-- ranks the centroids by their distance to the query's embedding, reads
-- the codes of the nearest few lists only (turn_embeddings_list_idx), and
-- compares the best few hundred of those exactly. docs/memory.md, "At
-- size", gives the sizes, the settings and what the lists cost in recall.
--
-- Lifecycle: a user's lists are per model and dimensions; the embedder
-- stores a new embedding with its list (embed_store.sql, in the same
-- statement, from the centroids then current), trains the lists when the
-- user crosses the size (and again when the user has grown fourfold), and
-- assigns the user's existing embeddings in batches afterwards
-- (`assigned_seq`, the user_seq reached). Until every embedding is
-- assigned (`complete`) the search takes the path without lists. A change
-- of model deletes the user's lists of other models (embed_store.sql).
-- Forgetting a user deletes its mark, and the lists and centroids with it
-- (ON DELETE CASCADE); deleting turns deletes their embeddings (0017), and
-- the lists are trained again from what remains when the user has shrunk
-- to half the size they were trained at (a centroid is the mean of many
-- turns; a deleted turn's share in it is gone then at the latest).

-- A user's lists of one model and dimensions.
CREATE TABLE embedding_lists (
    user_id       uuid    NOT NULL REFERENCES archive_marks (user_id) ON DELETE CASCADE,
    model         text    NOT NULL,
    dims          integer NOT NULL,
    -- the number of centroids (lists 0 to lists − 1)
    lists         integer NOT NULL CHECK (lists > 0),
    -- the user's embeddings when they were trained
    trained_turns bigint  NOT NULL,
    -- the user_seq up to which existing embeddings are assigned
    assigned_seq  bigint  NOT NULL DEFAULT 0,
    -- every embedding of the user (model, dims) has its list
    complete      boolean NOT NULL DEFAULT false,
    trained_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, model, dims)
);
-- The embedder's assignment work: lists not yet complete.
CREATE INDEX embedding_lists_incomplete_idx ON embedding_lists (trained_at) WHERE NOT complete;

-- The centroids, as parts (sql/0018_embedding_parts.sql), of unit length.
CREATE TABLE embedding_centroids (
    user_id uuid    NOT NULL,
    model   text    NOT NULL,
    dims    integer NOT NULL,
    list    integer NOT NULL,
    parts   cube[]  NOT NULL,
    PRIMARY KEY (user_id, model, dims, list),
    FOREIGN KEY (user_id, model, dims) REFERENCES embedding_lists (user_id, model, dims) ON DELETE CASCADE
);
ALTER TABLE embedding_centroids ALTER COLUMN parts SET STORAGE MAIN, SET (toast_tuple_target = 8160);

-- An embedding's list (NULL: none yet).
ALTER TABLE turn_embeddings ADD COLUMN list integer;

-- The lists' index replaces the codes' index (same leading columns, so the
-- code pass over all a user's codes still reads it alone) and the user
-- index (the exact path reads the user's rows through it): one index
-- fewer to write per embedding.
CREATE INDEX turn_embeddings_list_idx ON turn_embeddings (user_id, model, dims, list) INCLUDE (turn_id, code);
DROP INDEX turn_embeddings_code_idx;
DROP INDEX turn_embeddings_user_idx;

