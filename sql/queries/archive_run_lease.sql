-- Takes or renews the run lease of schedule $1 for owner $2, for $3
-- seconds: one row back when $2 holds it now (it was free, had run out, or
-- was already $2's), none while another owner's lease runs. A schedule
-- without a row yet gets one whose last tick claims nothing (the tick claim
-- moves it forward).
INSERT INTO archive_schedule AS s (name, last_tick, run_owner, run_expires_at)
VALUES ($1, '-infinity', $2, now() + make_interval(secs => $3))
ON CONFLICT (name) DO UPDATE
    SET run_owner = EXCLUDED.run_owner, run_expires_at = EXCLUDED.run_expires_at
    WHERE s.run_owner IS NULL OR s.run_owner = EXCLUDED.run_owner OR s.run_expires_at <= now()
RETURNING run_owner
