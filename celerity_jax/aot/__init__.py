"""Ahead-of-time compilation of the train step for an accelerator slice: memory, fit and XLA's estimates."""
