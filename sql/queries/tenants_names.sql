-- Every tenant's name by id (the labels of the per-tenant token metric).
SELECT id, name FROM tenants
