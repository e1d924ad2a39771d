"""The path-independence study: AA scores, the depth and initialisation sweeps and the
interventions of Anil et al. (2022) (README.md)."""
