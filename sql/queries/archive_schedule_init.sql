-- Gives schedule $1 its row at tick $2 on a fresh install, so that the
-- first start does not count the latest tick as missed.
INSERT INTO archive_schedule (name, last_tick)
VALUES ($1, $2)
ON CONFLICT (name) DO NOTHING
RETURNING last_tick
