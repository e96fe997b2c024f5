-- Opens the record of an archive run; a run that crashes keeps finished_at NULL.
INSERT INTO archive_runs (trigger, worker, only_user, tick)
VALUES ($1, $2, $3, $4)
RETURNING id
