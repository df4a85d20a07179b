"""celerity_jax: train LLM families predictably (CompleteP, tau-pinned AdamW, loss-curve collapse)."""

from celerity_jax.accelerators import pin_cpu_without_accelerators

pin_cpu_without_accelerators()  # before JAX starts: no TPU/GPU probing on a host that has neither
