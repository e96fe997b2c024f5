-- Whether claiming is paused, by whom, why and since when.
SELECT paused, reason, changed_by, changed_at FROM maas_control
