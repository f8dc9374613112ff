//! PostgreSQL backend (in progress).
