"""The CLRS study: the report over algorithms, modes and seeds, its tables and figures,
and the per-split diagnostics of a trained run (README.md)."""
