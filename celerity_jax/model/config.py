"""ModelConfig: the shape and parametrization of a decoder-only transformer (defaults = Celerity 300M)."""

import dataclasses

from celerity_jax.config_types import check_field_types
from celerity_jax.errors import ConfigError

NORMS = ("layernorm", "rmsnorm")
MLPS = ("squared_relu", "swiglu", "gelu", "gelu_tanh")
POSITIONS = ("alibi", "rope", "learned")
PARAMETRIZATIONS = ("completep", "mup", "standard")
COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
ATTENTION_IMPLS = ("auto", "xla", "blocked", "cudnn", "flash")
DENSE_BACKWARDS = ("auto", "plain", "transposed")
# What the backward pass keeps of a block's forward pass (the rest it recomputes), in order of recompute cost:
# ever less memory, ever more recompute. `transformer.REMAT_POLICIES` says what each saves.
REMATS = ("none", "dots", "attention", "qkv", "full")
RESIDUAL_DTYPES = ("auto", "float32", "bfloat16")
ROUTERS = ("hash", "topk")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every field gin can bind by name, e.g. `ModelConfig.d_model = 896`.

    d_base, n_layers_base, sigma_base, alpha_input, alpha_output describe the tuned base model
    (the µP proxy of the paper's section 3: width 256, 24 layers, σ 8.67e-2, α_in 9.17, α_out 1.095).
    That Celerity used this same base shape is our inference.

    mlp: "squared_relu" (Celerity's, relu(x)²), "swiglu" (silu(gate)·up, the section-3 family), "gelu" (exact
    GELU x·Φ(x), as PyTorch's nn.GELU() and the CompleteP reference code) or "gelu_tanh" (GELU's tanh
    approximation, jax.nn.gelu's default and GPT-2's). See docs/science.md §4.
    """

    n_layers: int = 13
    d_model: int = 640
    n_heads: int = 10
    # Key/value heads (grouped-query attention): query head h reads key/value head h // (n_heads // n_kv_heads).
    # None: n_heads, one key/value head per query head.
    n_kv_heads: int | None = None
    head_dim: int = 64
    vocab_size: int = 128256
    max_seq_len: int = 8192
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    mlp: str = "squared_relu"
    mlp_ratio: float = 8.0  # hidden width of the MLP = round(mlp_ratio * d_model)
    positions: str = "alibi"
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    use_bias: bool = False
    parametrization: str = "completep"
    depth_alpha: float = 1.0
    d_base: int = 256
    n_layers_base: int = 24
    sigma_base: float = 8.67e-2
    alpha_input: float = 9.17
    alpha_output: float = 1.095
    compute_dtype: str = "auto"  # "auto": bfloat16 on accelerators, float32 on CPU
    # How attention and the Dense backward are computed; the function is the same up to float rounding.
    # attention_impl "auto": "blocked" (einsums over causal query blocks) on CPU, "flash" on TPU and GPU; "xla" is
    # XLA's jax.nn.dot_product_attention, "cudnn" cuDNN's fused GPU kernel. "flash" is a Pallas kernel with ALiBi
    # computed inside it: Mosaic on TPU (`flash_attention.py`), Triton on NVIDIA GPUs (`flash_attention_gpu.py`),
    # the Pallas interpreter on CPU (tests).
    attention_impl: str = "auto"
    # dense_backward "auto": "transposed" (weight gradient as a plain GEMM, `matmul.py`) on CPU, "plain" elsewhere.
    dense_backward: str = "auto"
    # Sequence positions per chunk of the loss (`loss.chunked_cross_entropy`), which then never holds the
    # B×L×V logits at once; 0: whole logits; "auto": chunks only when one chip's logits would pass
    # loss.LOGITS_BUDGET_BYTES (`loss.logits_chunk_len`).
    logits_chunk_len: int | str = "auto"
    scan_layers: bool = False
    remat: str = "none"
    # The residual stream between blocks, and so each block's input that remat saves. "auto": float32 on CPU, where
    # the CompleteP checks run exact, bfloat16 on TPU and GPU, which halves those activations (docs/compile.md);
    # what bfloat16 does to the curves: docs/science.md. Norms, softmax and logits run in float32 either way.
    residual_dtype: str = "auto"
    # Mixture of experts: n_experts MLPs of kind `mlp` per block (1: the dense MLP), each token sent to
    # experts_per_token of them. router "hash": expert hash(token id) mod n_experts, fixed, one per token, no
    # auxiliary loss; "topk": a learned router's most probable experts, its probabilities the gates, trained with
    # router_aux_coef × the Switch load-balancing loss; normalize_gates divides a token's top-k gates by their sum
    # (Mixtral's rule).
    # Each expert takes at most capacity_factor × its even share of a sequence's routes; a route past that is
    # dropped (its MLP output is zero, the residual stream carries the token on). None: nothing is dropped (each
    # expert has room for the whole sequence).
    n_experts: int = 1
    router: str = "topk"
    experts_per_token: int = 1
    capacity_factor: float | None = 1.25
    # Positions dispatched together: a sequence is cut into groups of expert_group_len positions, each with its own
    # capacity (the dispatch tensors grow with the group's length squared, not the sequence's). None: the whole
    # sequence. RecipeConfig.seq_len must be a multiple of it.
    expert_group_len: int | None = None
    normalize_gates: bool = False
    router_aux_coef: float = 0.01
    # True: the experts split over the fsdp mesh axis, each chip running its own on every chip's tokens, which an
    # all-to-all brings (expert parallelism); False: every chip runs every expert on its own tokens, the expert
    # weights gathered as a dense MLP's. docs/moe.md compares the two.
    expert_parallel: bool = True

    def __post_init__(self):
        check_field_types(self)
        self.validate()

    @property
    def dtype(self) -> str:
        """The compute dtype, with "auto" resolved for the default JAX backend."""
        return _resolve(self, "compute_dtype")

    @property
    def residual(self) -> str:
        """residual_dtype with "auto" resolved for the default JAX backend."""
        return _resolve(self, "residual_dtype")

    @property
    def attention_kernel(self) -> str:
        """attention_impl with "auto" resolved for the default JAX backend."""
        return _resolve(self, "attention_impl")

    @property
    def dense_backward_kernel(self) -> str:
        """dense_backward with "auto" resolved for the default JAX backend."""
        return _resolve(self, "dense_backward")

    def for_platform(self, platform: str) -> "ModelConfig":
        """This config with every "auto" choice made for `platform` ("cpu", "tpu", "gpu" or "cuda"), as a run on
        that platform would make it: used to compile for an accelerator from a CPU host."""
        if self.attention_impl == "cudnn" and platform not in ("gpu", "cuda"):
            _fail("attention_impl", self.attention_impl, f"runs on NVIDIA GPUs only, not on {platform}; "
                  "use 'auto' or 'xla'")
        return dataclasses.replace(self, **{name: _resolve(self, name, platform) for name in AUTO_CHOICES})

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads when that is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_ff(self) -> int:
        """Hidden width of the MLP."""
        return round(self.mlp_ratio * self.d_model)

    def validate(self) -> None:
        """Raise ConfigError naming the field, the problem and the fix."""
        for name in ("n_layers", "d_model", "n_heads", "head_dim", "vocab_size", "max_seq_len",
                     "d_base", "n_layers_base", "n_experts"):
            value = getattr(self, name)
            if value < 1:
                _fail(name, value, "must be a positive integer")
        for name in ("norm_eps", "mlp_ratio", "rope_theta", "sigma_base", "alpha_input", "alpha_output"):
            value = getattr(self, name)
            if not value > 0:
                _fail(name, value, "must be a positive number")
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS),
                              ("parametrization", PARAMETRIZATIONS), ("compute_dtype", COMPUTE_DTYPES),
                              ("attention_impl", ATTENTION_IMPLS), ("dense_backward", DENSE_BACKWARDS),
                              ("remat", REMATS), ("residual_dtype", RESIDUAL_DTYPES), ("router", ROUTERS)):
            value = getattr(self, name)
            if value not in allowed:
                _fail(name, value, f"is not a known option; use one of {', '.join(allowed)}")
        if self.d_model % self.n_heads:
            _fail("d_model", self.d_model, f"is not divisible by n_heads={self.n_heads}; "
                  "choose n_heads that divides d_model")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            _fail("n_kv_heads", self.n_kv_heads, f"must divide n_heads={self.n_heads}; choose a divisor of it, or "
                  "None for one key/value head per query head")
        if self.n_heads * self.head_dim != self.d_model:
            _fail("head_dim", self.head_dim, f"does not match d_model/n_heads = {self.d_model // self.n_heads}; "
                  "set head_dim = d_model // n_heads")
        if not 0.5 <= self.depth_alpha <= 1.0:
            _fail("depth_alpha", self.depth_alpha, "must lie in [0.5, 1] (1 is CompleteP)")
        chunk = self.logits_chunk_len
        if chunk != "auto" and (isinstance(chunk, str) or chunk < 0):
            _fail("logits_chunk_len", chunk, "must be 'auto', 0 (whole logits) or a positive number of positions")
        if self.d_ff < 1:
            _fail("mlp_ratio", self.mlp_ratio, f"gives an MLP width of {self.d_ff}; raise it")
        if self.positions == "rope" and self.head_dim % 2:
            _fail("head_dim", self.head_dim, "must be even for RoPE; use an even head_dim")
        if not 1 <= self.experts_per_token <= self.n_experts:
            _fail("experts_per_token", self.experts_per_token, f"must lie in [1, n_experts={self.n_experts}]")
        if self.router == "hash" and self.experts_per_token != 1:
            _fail("experts_per_token", self.experts_per_token, "must be 1 with router='hash' (one expert per token)")
        if self.expert_group_len is not None and self.expert_group_len < 1:
            _fail("expert_group_len", self.expert_group_len, "must be a positive number of positions, or None for "
                  "the whole sequence")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            _fail("capacity_factor", self.capacity_factor, "must be a positive number, or None to drop nothing")
        if self.router_aux_coef < 0:
            _fail("router_aux_coef", self.router_aux_coef, "must be >= 0 (0 turns the load-balancing loss off)")
        if self.attention_impl == "cudnn" and self.compute_dtype == "float32":
            _fail("attention_impl", self.attention_impl, "needs compute_dtype='bfloat16'; "
                  "set ModelConfig.compute_dtype = 'bfloat16' or attention_impl = 'xla'")


# What "auto" means per platform ("cpu", "tpu", "gpu"), for the fields that accept it.
AUTO_CHOICES = {
    "compute_dtype": {"cpu": "float32", "tpu": "bfloat16", "gpu": "bfloat16"},
    "attention_impl": {"cpu": "blocked", "tpu": "flash", "gpu": "flash"},
    "dense_backward": {"cpu": "transposed", "tpu": "plain", "gpu": "plain"},
    "residual_dtype": {"cpu": "float32", "tpu": "bfloat16", "gpu": "bfloat16"},
}


def _resolve(cfg: ModelConfig, name: str, platform: str | None = None) -> str:
    value = getattr(cfg, name)
    if value != "auto":
        return value
    if platform is None:
        import jax

        platform = jax.default_backend()
    return AUTO_CHOICES[name]["gpu" if platform == "cuda" else platform]


def _fail(name: str, value, problem: str) -> None:
    raise ConfigError(f"ModelConfig.{name}={value!r} {problem}")
