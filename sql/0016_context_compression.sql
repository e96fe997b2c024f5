-- A request's context (`final_context_payload`: about 7 kB once memory
-- fills its budget) and its sources (`context_sources`: about 3.5 kB) are
-- compressed when written (TOAST) and decompressed when the responder's
-- claim reads the context back. lz4 does both several times faster than
-- PostgreSQL's default pglz: an UPDATE writing a 6.9 kB context and 3.7 kB
-- of sources took 0.30 ms with pglz and 0.22 ms with lz4 (pgbench, one
-- client, durable commits; the same UPDATE with a small context 0.13 ms;
-- BENCHMARKS.md, session 7). Only values written from now on use lz4; the
-- ones already stored stay readable as they are. A server without lz4 (one
-- built without it, or older than PostgreSQL 14) keeps pglz: the migration
-- says so in a notice and goes on.
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 140000 THEN
        BEGIN
            -- (a string, so that an older server's parser never sees the syntax)
            EXECUTE 'ALTER TABLE pipeline_runs
                         ALTER COLUMN final_context_payload SET COMPRESSION lz4,
                         ALTER COLUMN context_sources SET COMPRESSION lz4,
                         ALTER COLUMN final_answer SET COMPRESSION lz4';
        EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
            RAISE NOTICE 'lz4 is not available on this server (%); contexts stay compressed with pglz', SQLERRM;
        END;
    ELSE
        RAISE NOTICE 'PostgreSQL % has no lz4 column compression; contexts stay compressed with pglz',
            current_setting('server_version');
    END IF;
END
$$;
