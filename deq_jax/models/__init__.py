"""Task models by family, above `deq_jax.nn`: the CLRS package (`deq_jax.models.clrs`).

Importing a family registers what it names: ``deq_jax.models.clrs`` registers the task
``clrs`` in `deq_jax.tasks`' registry (the tasks layer imports no model).
"""

from deq_jax.models import clrs

__all__ = ["clrs"]
