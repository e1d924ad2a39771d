"""The neural-solver study: speed/accuracy Pareto curves of the classic solvers and the
learned HyperAnderson solver on a trained DEQ (README.md)."""
