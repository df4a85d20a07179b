"""The model family: a decoder-only transformer with µP / CompleteP parametrization.

Modules: `config` (ModelConfig and its validation), `presets` (Celerity, section-3 and tiny shapes),
`completep` (the single home of the per-parameter rules), `positions` (ALiBi, RoPE), `transformer`
(`init_params`, `apply`), `loss` (cross-entropy), `params` (`count_params`, `flops_per_token`),
`coordcheck` (the coordinate check) and `commands` (`celerity coordcheck`).
"""
