//! maas: a PostgreSQL-native orchestrator.
