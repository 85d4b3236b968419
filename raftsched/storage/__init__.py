"""Storage: each node's copy of the replicated tables (LMDB, or memory for tests)."""
