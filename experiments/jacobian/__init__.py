"""The Jacobian-regularisation study: the regularised and plain DEQs side by side, over
seeds and solver budgets (README.md)."""
