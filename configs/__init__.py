"""Configurations: one ``get_config()`` per file, run by ``python -m launch.main``."""
