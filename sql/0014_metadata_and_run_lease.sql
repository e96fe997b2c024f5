-- A client's own data on a request: `metadata`, a JSON object given at
-- submit (`POST /api/query`), stored as is and shown by the status API and
-- `maasctl requests show`. The engine never reads it.
--
-- The API refuses anything but an object of at most 4096 bytes (compact
-- JSON) and 8 levels of nesting, naming the field. The table's own bound is
-- looser (jsonb's text form adds spaces), so a row another producer inserts
-- is held to the same shape: an object, at most 16 kB as text.
-- A new nullable column without a default is added without a rewrite; the
-- constraints are on a column that is NULL in every existing row.
ALTER TABLE pipeline_runs ADD COLUMN metadata jsonb;

ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_metadata_object
    CHECK (metadata IS NULL OR jsonb_typeof(metadata) = 'object') NOT VALID;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_metadata_object;
ALTER TABLE pipeline_runs ADD CONSTRAINT pipeline_runs_metadata_size
    CHECK (metadata IS NULL OR octet_length(metadata::text) <= 16384) NOT VALID;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_metadata_size;

-- The archive-run lease (replaces a session advisory lock, which does not
-- survive a transaction-mode pooler such as PgBouncer): a scheduled run
-- holds run_owner until run_expires_at, renewing it while it runs; another
-- daemon's tick takes it only once it is free or has run out.
ALTER TABLE archive_schedule ADD COLUMN run_owner text;
ALTER TABLE archive_schedule ADD COLUMN run_expires_at timestamptz;
