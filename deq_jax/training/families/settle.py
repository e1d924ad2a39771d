"""`SettleRule`: when an evaluation's fixed-point solve also stops on the model's answer.

A model whose output is discrete (pointers, masks, classes) reaches its final answer
long before the residual test passes. With ``patience > 0`` the eval solve of each
sample also stops once the decoded answer has not changed for that many steps
(`deq_jax.nn.settled_apply`); the config keys are ``deq.settle_patience`` and
``deq.settle_tol``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from deq_jax.nn.intercept import settled_apply


@dataclasses.dataclass(frozen=True)
class SettleRule:
    """When an eval solve also stops: once the model's decoded answer (the argmax of
    its outputs) has not changed for ``patience`` steps (0: never; the residual test
    only), with the residual tolerance ``tol`` (0: the solver's own).
    `deq_jax.nn.settled_apply` runs it; `from_config` reads a config's ``deq``.

    Raises:
      ValueError: for a negative or non-integer patience, or a negative tolerance.
    """

    patience: int = 0
    tol: float = 0.0

    def __post_init__(self):
        if not isinstance(self.patience, int) or self.patience < 0:
            raise ValueError(f"deq.settle_patience must be an integer >= 0, got {self.patience!r}.")
        if not self.tol >= 0:
            raise ValueError(f"deq.settle_tol must be >= 0 (0: the solver's), got {self.tol!r}.")

    @classmethod
    def from_config(cls, eval_config: Any) -> SettleRule:
        """From ``deq.settle_patience`` and ``deq.settle_tol`` (both optional)."""
        return cls(eval_config.get("settle_patience", 0), eval_config.get("settle_tol", 0.0))

    def apply(self, model: Any, variables: Any, inputs: Any, **kwargs: Any) -> tuple[Any, Any]:
        """``model.apply(variables, inputs, train=False, **kwargs)`` with this rule: through
        `deq_jax.nn.settled_apply` when ``patience > 0`` (a model that calls no
        `deq_jax.nn.DEQ` is applied as usual)."""
        if not self.patience:
            return model.apply(variables, inputs, train=False, **kwargs)
        return settled_apply(
            model,
            variables,
            inputs,
            patience=self.patience,
            tol=self.tol or None,
            strict=False,
            **kwargs,
        )
