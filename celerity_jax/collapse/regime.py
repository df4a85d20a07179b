"""The short-run regime: how long a run must be before its normalized curve takes the shape that collapse is about.

A run of fewer than MIN_STEPS optimizer steps, or fewer than MIN_TOKENS training tokens, has a normalized curve
whose shape still moves with the run's length at a fixed N, τ and schedule: it spends a larger part of training
in the fast early drop of the loss, a transient of a fixed number of steps, and its normalized curve is flatter
after it. The thresholds are the knees in steps and in tokens that experiments/short_run_regime/ measured on the
CPU-sized family (results.md there; docs/science.md §9), each at the upper end of its resampled range, to two
significant figures. A run, or a reference made from one, below them is still usable, but its shape is not its
longer siblings', so the tools that compare shapes warn.
"""

MIN_STEPS = 1_300
MIN_TOKENS = 650_000


def outside(steps: int, tokens: int) -> str | None:
    """One warning line when a run of `steps` steps and `tokens` tokens is shorter than the regime, else None."""
    short = [f"{steps:,} steps (< {MIN_STEPS:,})"] if steps < MIN_STEPS else []
    short += [f"{tokens:,} tokens (< {MIN_TOKENS:,})"] if tokens < MIN_TOKENS else []
    if not short:
        return None
    return (f"{' and '.join(short)}: shorter than the regime where a normalized curve's shape stops moving with the "
            f"run's length (at least {MIN_STEPS:,} steps and {MIN_TOKENS:,} tokens); its shape is not that of "
            "longer runs")
