"""The model card (README.md) of an export: the run (plan, final losses, downstream scores) and what the folder
holds."""

import csv
import os

from celerity_jax import markdown, rundir
from celerity_jax.evaluate import results
from celerity_jax.hf import fold, layouts
from celerity_jax.model.config import ModelConfig


def _last_row(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def run_section(workdir: str, step: int, plan: dict) -> list[str]:
    """The run: its plan, the final train and eval losses, and the downstream scores of the exported step."""
    lines = ["## The run", "",
             f"Exported from `{os.path.abspath(workdir)}` at step {step:,} of {plan['steps']:,}.", ""]
    rows = [["N (parameters)", f"{plan['n_params']:,}"], ["D (tokens)", f"{plan['tokens']:,}"],
            ["TPP", f"{plan['tpp']:g}"], ["τ (AdamW timescale)", f"{plan['tau']:.4g}"],
            ["steps", f"{plan['steps']:,}"],
            ["batch", f"{plan['batch_seqs']} × {plan['seq_len']} = {plan['batch_tokens']:,} tokens"],
            ["schedule", f"{plan['schedule']}, {plan['warmup_steps']} warmup steps"],
            ["base LR; hidden peak LR", f"{plan['base_lr']:.4g}; {plan['lr_hidden']:.4g}"],
            ["peak LR per role", ", ".join(f"{k} {v:.4g}" for k, v in plan["lr_peak"].items())],
            ["weight decay λ", f"{plan['weight_decay']:.4g} ({plan['decay_convention']})"],
            ["Adam β1, β2, ε; grad clip", f"{plan['adam_b1']}, {plan['adam_b2']}, {plan['adam_eps']:g}; "
                                          f"{plan['grad_clip']}"]]
    for name, label in ((rundir.CURVE_CSV, "final train loss"), (rundir.EVAL_CSV, "final eval loss")):
        if (row := _last_row(os.path.join(workdir, name))) is not None:
            rows.append([label, f"{float(row['loss']):.4f} (step {row['step']}, `{name}`)"])
    lines += markdown.table(["", ""], rows) + [""]
    if (content := results.load(workdir, step)) is not None:
        lines += ["### Downstream scores (`celerity eval`)", ""] + results.table(content) + [""]
    else:
        lines += [f"No downstream scores at step {step} (`celerity eval --workdir ... --step {step}` writes them).", ""]
    return lines


def _mixture_lines(cfg: ModelConfig) -> list[str]:
    """What a mixture of experts' routing means for the class's forward and for decoding with a KV cache."""
    if cfg.n_experts == 1:
        return []
    routing = (f"each token goes to expert hash(token id) mod {cfg.n_experts}" if cfg.router == "hash" else
               f"each token goes to the router's {cfg.experts_per_token} most probable of {cfg.n_experts} experts, "
               "gated by their probabilities" + (" divided by their sum" if cfg.normalize_gates else ""))
    lines = [f"The MLPs are a mixture of experts: {routing}."]
    if layouts.can_drop(cfg):
        lines.append(f"An expert takes at most capacity_factor = {cfg.capacity_factor} × its even share of the routes "
                     "of one call's sequence, in order of position; the rest are dropped. Decoding with the KV cache "
                     "dispatches each new token alone (never dropped), so its logits can differ from those of a "
                     "forward pass over the whole text; `from_pretrained(DIR, trust_remote_code=True, "
                     "capacity_factor=None)` drops nothing.")
    return [" ".join(lines), ""]


def model_card(cfg: ModelConfig, arch: str, *, dtype: str, tokenizer_note: str, run_lines: list[str],
               lost_values: int) -> str:
    """The README.md of the folder; `lost_values`: how many values the fold maps onto another's (fold.lost_bits)."""
    c = fold.constants(cfg)
    remote = ", trust_remote_code=True" if arch == "celerity" else ""
    load = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = AutoModelForCausalLM.from_pretrained(DIR{remote})\n"
            f"tokenizer = AutoTokenizer.from_pretrained(DIR{remote})")
    model_rows = [[name, f"`{getattr(cfg, name)!r}`"] for name in layouts.ARCHITECTURE_FIELDS]
    lines = [
        f"# {layouts.CLASSES[arch]} exported by celerity_jax", "",
        f"A {cfg.n_layers}-layer, width-{cfg.d_model} decoder trained with celerity_jax (CompleteP parametrization "
        f"`{cfg.parametrization}`), as a `{layouts.CLASSES[arch]}` in {dtype}"
        + (", with its code in this folder (`modeling_celerity.py`; load with `trust_remote_code=True`)"
           if remote else ", a stock transformers class") + ".", "",
        "```python", load, "```", "",
        *run_lines,
        "## How the weights differ from the run's checkpoint", "",
        "The CompleteP forward multipliers are folded into the weights (in float64, rounded once), so the model "
        "computes the run's logits with no multiplier of its own:", "",
        f"- α_input = {c['input']:.6g} into the token embedding" + (" and the learned positions" if
                                                                  cfg.positions == "learned" else "") + ";",
        f"- the attention scale, as {c['query']:.6g} × the query projection, so that the class's 1/sqrt(head_dim) "
        "gives the run's scale;",
        f"- the residual multiplier m_L^−α = {c['residual']:.6g} into the attention output and MLP down projections "
        "(weights and biases);",
        f"- α_output/m_d = {c['output']:.6g} into `lm_head`.",
        "",
        "The embedding is exported untied" + (" although the run ties it (`tie_embeddings`): one matrix cannot hold "
                                              "both α_input and α_output/m_d, so `lm_head` is its folded copy. "
                                              "`celerity import-hf` ties it again."
                                              if cfg.tie_embeddings else ".") + " " + tokenizer_note + ".", "",
        *_mixture_lines(cfg),
        "`config.json` carries the run's ModelConfig (`celerity_model`): `celerity import-hf` unfolds the weights "
        "with it. A fold by a factor that is not a power of two can map two float32 values to one; "
        + (f"`{fold.LOST_BITS}` holds the bit that tells them apart for the {lost_values:,} values where that "
           "happened, so the import of these weights is bit for bit (weights changed since come back at most one "
           "ulp off)."
           if lost_values else "no value of these weights was, so the import is bit for bit."
           if dtype == "float32" else "in bfloat16 every weight is rounded, so the import is close, not exact."),
        "",
        "### ModelConfig", "", *markdown.table(["field", "value"], model_rows), ""]
    return "\n".join(lines)
