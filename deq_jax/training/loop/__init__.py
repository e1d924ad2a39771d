"""The one training loop: `train_and_evaluate(config, workdir)` (``train``) sets a run
up through its family, then `Loop` (``loop``) trains, evaluates, selects, saves and
reports; ``floor_notice`` says when a reduced-precision run sits at its residual floor.

Everything the loop calls lives in the places below it: the families
(`deq_jax.training.families`), the neural-solver fit that the alternating mode
interleaves (`deq_jax.training.solver_fit`) and the run's machinery
(`deq_jax.training.run`).
"""
