"""Command-line entry points: the only code that reads absl flags.

``python -m launch.main --config configs/prefix_sum.py --workdir DIR`` trains;
``python -m launch.evaluate --config ... --workdir DIR`` evaluates a checkpoint;
``launch.sample`` samples a trained language model, ``launch.prepare_data`` prepares a
corpus, ``launch.multiprocess`` runs one job as several processes, ``launch.seed_report``
trains and scores a config over seeds and ``launch.compare_runs`` compares two runs'
metrics. They share one flags module, `launch.flags` (``--config``, ``--workdir`` and
their checks); `launch.runs` (finished runs, report files) and `launch.seeds` (seed
lists and statistics) are helpers they share with the studies in ``experiments/``.
Benchmarks live in ``benchmarks/``.
"""
