"""Command-line entry points: the only code that reads absl flags.

``python -m launch.main --config configs/prefix_sum.py --workdir DIR`` trains;
``python -m launch.evaluate --config ... --workdir DIR`` evaluates a checkpoint.
"""
