"""celerity_jax: train LLM families predictably (CompleteP, tau-pinned AdamW, loss-curve collapse)."""
