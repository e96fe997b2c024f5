-- Claims cron tick $2 of schedule $1 for this daemon: the row only moves
-- forward, so of several daemons firing for the same tick exactly one gets
-- a row back.
INSERT INTO archive_schedule AS s (name, last_tick)
VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET last_tick = EXCLUDED.last_tick
    WHERE s.last_tick < EXCLUDED.last_tick
RETURNING last_tick
