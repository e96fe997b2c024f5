-- The size checks of long text columns, without reading the text.
--
-- A CHECK runs on every new row version, whatever the UPDATE changed, so
-- each claim, finish and heartbeat of a request counted the characters of
-- its query, context, answer and error again: length() decompresses a
-- compressed value and walks its multibyte characters. With a context of
-- 3,000 Cyrillic characters (compressed in the row) that was about 17 µs per
-- row version, most of what the constraints cost. octet_length() reads the
-- size from the value's header, without decompressing it; a text's bytes
-- are never fewer than its characters, so a text of at most N bytes holds
-- at most N characters and the character count is needed only above that.
-- `octet_length(x) <= N OR length(x) <= N` is the same condition as
-- `length(x) <= N`, and the OR stops at its first half for every value
-- under the limit in bytes. The names, limits and refusals stay as they
-- were (sql/0001_pipeline.sql, sql/0009_row_bounds.sql).

ALTER TABLE pipeline_runs
    DROP CONSTRAINT pipeline_runs_query_size,
    ADD CONSTRAINT pipeline_runs_query_size
        CHECK (octet_length(user_query) <= 100000 OR length(user_query) <= 100000) NOT VALID,
    DROP CONSTRAINT pipeline_runs_lease_owner_size,
    ADD CONSTRAINT pipeline_runs_lease_owner_size
        CHECK (octet_length(lease_owner) <= 256 OR length(lease_owner) <= 256) NOT VALID,
    DROP CONSTRAINT pipeline_runs_error_size,
    ADD CONSTRAINT pipeline_runs_error_size
        CHECK (octet_length(error) <= 100000 OR length(error) <= 100000) NOT VALID,
    DROP CONSTRAINT pipeline_runs_answer_size,
    ADD CONSTRAINT pipeline_runs_answer_size
        CHECK (octet_length(final_answer) <= 1000000 OR length(final_answer) <= 1000000) NOT VALID,
    DROP CONSTRAINT pipeline_runs_context_size,
    ADD CONSTRAINT pipeline_runs_context_size
        CHECK (octet_length(final_context_payload) <= 4000000 OR length(final_context_payload) <= 4000000) NOT VALID;

ALTER TABLE raw_logs
    DROP CONSTRAINT raw_logs_content_size,
    ADD CONSTRAINT raw_logs_content_size
        CHECK (octet_length(content) <= 1000000 OR length(content) <= 1000000) NOT VALID;

-- The same conditions as before, so every row holds them already; the
-- scans only mark them validated.
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_query_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_lease_owner_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_error_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_answer_size;
ALTER TABLE pipeline_runs VALIDATE CONSTRAINT pipeline_runs_context_size;
ALTER TABLE raw_logs VALIDATE CONSTRAINT raw_logs_content_size;
