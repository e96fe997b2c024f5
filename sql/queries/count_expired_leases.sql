-- Leases that ran out and are not yet taken back (`maasctl sweep --dry-run`).
SELECT count(*) AS expired FROM pipeline_runs WHERE status IN ('ANALYZING', 'ASSEMBLING', 'RESPONDING') AND lease_expires_at < now()
