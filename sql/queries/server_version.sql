-- The server's version, for `maasctl doctor`.
SELECT current_setting('server_version') AS server_version
