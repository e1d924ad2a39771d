"""Timing and memory tools: solver benchmarks, the cost of one training step and of the
convolutional and multi-branch cells, and the language model's memory (README.md)."""
