-- How full the server's notification queue is (0 to 1), for `maasctl doctor`.
SELECT pg_notification_queue_usage() AS usage
