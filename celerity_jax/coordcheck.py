"""Coordinate check: activation RMS after a few Adam steps must not depend on width or depth.

Tiny models see the same batch at the same base LR; plain Adam (β 0.9/0.95, no decay) applies the
per-parameter LR and eps multipliers of `completep`. We record, per step, the RMS of the last
residual stream and of the logits. Under CompleteP these stay put across width and depth; under
the standard parametrization they grow with width. With n_experts > 1 every model of the sweep has a
mixture-of-experts MLP (a top-k router by default), so the experts' and the router's roles are checked too.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from celerity_jax import optim
from celerity_jax.model import completep, loss, transformer
from celerity_jax.model.config import ModelConfig

QUANTITIES = ("residual_rms", "logits_rms")


@dataclasses.dataclass(frozen=True)
class CoordCheckConfig:
    widths: tuple[int, ...] = (64, 128, 256, 512)
    depths: tuple[int, ...] = (2, 4, 8, 16)
    fixed_depth: int = 2  # depth of the width sweep (= n_layers_base)
    fixed_width: int = 64  # width of the depth sweep (= d_base)
    head_dim: int = 16
    vocab_size: int = 64
    seq_len: int = 16
    batch_seqs: int = 4
    steps: int = 10
    base_lr: float = 1e-2
    base_eps: float = 1e-8
    seed: int = 0
    n_experts: int = 1
    router: str = "topk"
    experts_per_token: int = 1


def model_config(cc: CoordCheckConfig, mode: str, d_model: int, n_layers: int) -> ModelConfig:
    """A Celerity-architecture model of the sweep, with base shape = the smallest of the sweep."""
    return ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=d_model // cc.head_dim,
                       head_dim=cc.head_dim, vocab_size=cc.vocab_size, max_seq_len=cc.seq_len,
                       parametrization=mode, d_base=min(cc.widths), n_layers_base=min(cc.depths),
                       scan_layers=True, n_experts=cc.n_experts, router=cc.router,
                       experts_per_token=cc.experts_per_token)


def batch_tokens(cc: CoordCheckConfig) -> np.ndarray:
    """Learnable fixed batch tokens_Bx(L+1): arithmetic sequences mod vocab with random start/stride."""
    rng = np.random.default_rng(cc.seed)
    start_B, stride_B = rng.integers(0, cc.vocab_size, (2, cc.batch_seqs))
    steps_L = np.arange(cc.seq_len + 1)
    return ((start_B[:, None] + stride_B[:, None] * steps_L[None]) % cc.vocab_size).astype(np.int32)


def train_and_record(cfg: ModelConfig, tokens_BxL1: np.ndarray, cc: CoordCheckConfig) -> dict[str, np.ndarray]:
    """Loss and RMS values before each of cc.steps Adam steps and after the last: arrays [steps+1]."""
    inputs, targets = jnp.asarray(tokens_BxL1[:, :-1]), jnp.asarray(tokens_BxL1[:, 1:])
    rng = jax.random.key(cc.seed)
    params = _compiled(lambda r: transformer.init_params(cfg, r), rng)(rng)
    mult = completep.multipliers(cfg, transformer.declarations(cfg))
    # The optimizer training uses, at a constant LR and without weight decay.
    optimizer = optim.tau_pinned_adamw(cc.base_lr, 0.0, b1=0.9, b2=0.95,
                                       eps=jax.tree.map(lambda e: cc.base_eps * e, mult.eps),
                                       lr_multipliers=mult.lr, decay_mask=mult.decay, grad_clip=0.0)

    def loss_fn(params):
        logits_BxLxV, stats = transformer.apply(cfg, params, inputs, return_stats=True)
        value, _ = loss.cross_entropy(logits_BxLxV, targets)
        return value, {"loss": value, "residual_rms": stats["residual_rms"][-1], "logits_rms": stats["logits_rms"]}

    def adam_step(params, opt_state):
        grads, record = jax.grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, record

    opt_state = optimizer.init(params)
    step = _compiled(adam_step, params, opt_state)
    records = []
    for t in range(1, cc.steps + 2):  # the last call only records
        new_params, new_opt_state, record = step(params, opt_state)
        if t <= cc.steps:
            params, opt_state = new_params, new_opt_state
        records.append(record)
    return {k: np.array([float(r[k]) for r in records]) for k in records[0]}


def _compiled(fn, *args):
    """fn(*args) compiled, trading run speed for compile speed on CPU, where these tiny models spend
    most of their time in XLA's fusion emitters and LLVM optimization."""
    options = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
    return jax.jit(fn).lower(*args).compile(options if jax.default_backend() == "cpu" else None)


def run(cc: CoordCheckConfig, modes: tuple[str, ...] = ("standard", "completep"),
        sweeps: tuple[str, ...] = ("width", "depth")) -> dict:
    """results[mode][sweep] = {"sizes": [...], "loss"/"residual_rms"/"logits_rms": [n_sizes, steps+1]}."""
    tokens = batch_tokens(cc)
    shapes = {"width": [(d, cc.fixed_depth) for d in cc.widths],
              "depth": [(cc.fixed_width, n) for n in cc.depths]}
    done = {}  # the sweeps share the model at (fixed_width, fixed_depth)
    results = {}
    for mode in modes:
        results[mode] = {}
        for sweep in sweeps:
            for shape in shapes[sweep]:
                if (mode, shape) not in done:
                    done[mode, shape] = train_and_record(model_config(cc, mode, *shape), tokens, cc)
            runs = [done[mode, shape] for shape in shapes[sweep]]
            results[mode][sweep] = {"sizes": list(cc.widths if sweep == "width" else cc.depths),
                                    **{k: np.stack([r[k] for r in runs]) for k in runs[0]}}
    return results


def spread(values: np.ndarray) -> float:
    """max/min of positive values: 1 means identical across the sweep."""
    return float(np.max(values) / np.min(values))


def plot(results: dict, out_path: str) -> None:
    """The usual coordcheck figure: RMS against size, one line per step, one column per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(results)
    sweeps = sorted({sweep for mode in modes for sweep in results[mode]}, reverse=True)  # width first
    rows = [(sweep, q) for sweep in sweeps for q in QUANTITIES]
    fig, axes = plt.subplots(len(rows), len(modes), figsize=(4 * len(modes), 3 * len(rows)), squeeze=False,
                             sharey="row")
    for col, mode in enumerate(modes):
        for row, (sweep, q) in enumerate(rows):
            ax = axes[row][col]
            if sweep not in results[mode]:
                ax.axis("off")
                continue
            res = results[mode][sweep]
            n_steps = res[q].shape[1]
            colors = plt.cm.viridis(np.linspace(0, 1, n_steps))
            for t in range(n_steps):
                ax.plot(res["sizes"], res[q][:, t], color=colors[t], marker="o", ms=3, label=f"step {t}")
            ax.set(xscale="log", yscale="log", xlabel=sweep, ylabel=q.replace("_", " "),
                   title=f"{mode}: {q} vs {sweep}")
            ax.set_xticks(res["sizes"], [str(s) for s in res["sizes"]])
            ax.minorticks_off()
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
