"""The language-model study: the bits-per-character table over runs and seeds
(README.md)."""
