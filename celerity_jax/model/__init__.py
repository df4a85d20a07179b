"""The model family: a decoder-only transformer with µP / CompleteP parametrization.

Modules: `config` (ModelConfig and its validation), `presets` (Celerity, section-3 and tiny shapes),
`completep` (the single home of the per-parameter rules), `positions` (ALiBi, RoPE), `transformer`
(`init_params`, `apply`; the MLP dense or `moe`'s mixture of experts), `attention` (blocked causal attention),
`flash_attention` / `flash_attention_gpu` (the Pallas kernels for TPU and GPU, sharing `flash_common`), `matmul`
(the Dense backward as plain GEMMs), `loss` (cross-entropy, whole or chunked), `params` (`count_params`,
`count_active_params`, `flops_per_token`) and `sharding` (the device mesh and the spec of every parameter, keyed by
the module names `transformer` gives).
"""
