import dataclasses
import json
import pathlib

import numpy as np
import pytest

from celerity_jax import gin_config, recipe
from celerity_jax.errors import ConfigError
from celerity_jax.model import completep, params, presets
from celerity_jax.model.config import ModelConfig
from celerity_jax.recipe import RecipeConfig

CELERITY_DIR = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "celerity"
# docs/science.md §7: params N, batch in sequences of 8192, tokens at 20 / 80 / 234 TPP.
CELERITY = {
    "celerity-300m": (2.71e8, 176, (5.4e9, 21.7e9, 63.4e9)),
    "celerity-500m": (5.03e8, 240, (10.1e9, 40.2e9, 117.8e9)),
    "celerity-900m": (9.06e8, 336, (18.1e9, 72.5e9, 212.3e9)),
    "celerity-1.8b": (1.81e9, 464, (36.2e9, 144.8e9, 424.0e9)),
    "celerity-3.9b": (3.88e9, 672, (77.6e9, 310.4e9, 909.2e9)),
}
TINY = presets.preset("tiny-d32")
TINY_RECIPE = RecipeConfig(seq_len=64, batch_seqs=8, warmup_tokens=None)


def _paper_610m_lr_hidden():
    """η of the paper's 610M µP model (d_model 2048, d_base 256, η_base 1.62e-2) via CompleteP's rules."""
    cfg = ModelConfig(d_model=2048, n_heads=32, head_dim=64, n_layers=24, parametrization="mup")
    return 1.62e-2 * completep.role_rules(cfg)[completep.Role.HIDDEN][1]


def test_tau_610m_80tpp_and_batch_grid():
    lr = _paper_610m_lr_hidden()
    assert recipe.tau_from(504 * 2048, lr, 0.1, 48.5e9) == pytest.approx(0.105, rel=0.005)
    # The paper prints three decimals: agree to within one unit of the last one.
    for batch_seqs, tau in zip((126, 252, 504, 1008, 2016), (0.026, 0.053, 0.105, 0.210, 0.421)):
        assert recipe.tau_from(batch_seqs * 2048, lr, 0.1, 48.5e9) == pytest.approx(tau, abs=1e-3)


def test_tau_llama2():
    assert recipe.tau_from(4e6, 3e-4, 0.1, 2e12) == pytest.approx(0.067, rel=0.005)
    assert recipe.tau_from(4e6, 1.5e-4, 0.1, 2e12) == pytest.approx(0.133, rel=0.005)


def test_weight_decay_for_tau_inverts_tau_from():
    wd = recipe.weight_decay_for_tau(1e6, 2e-3, 0.105, 48.5e9)
    assert recipe.tau_from(1e6, 2e-3, wd, 48.5e9) == pytest.approx(0.105, rel=1e-12)


def test_tau_law_matches_celerity_bands():
    for tpp, tau in ((20, 0.175), (80, 0.087), (234, 0.051)):
        assert recipe.tau_law(tpp) == pytest.approx(tau, rel=0.02)
    exponent, log_coef = np.polyfit(np.log([20, 80, 234]), np.log([0.175, 0.087, 0.051]), 1)
    defaults = RecipeConfig()
    assert np.exp(log_coef) == pytest.approx(defaults.tau_law_coef, rel=0.02)
    assert exponent == pytest.approx(defaults.tau_law_exponent, abs=0.01)


@pytest.mark.parametrize("name", CELERITY)
def test_celerity_tokens_per_band_and_batch_from_law(name):
    n_table, batch_table, tokens_table = CELERITY[name]
    plan = recipe.make_plan(presets.preset(name), RecipeConfig())
    assert plan.n_params == pytest.approx(n_table, rel=0.01)
    assert [b["tpp"] for b in plan.bands] == [20, 80, 234]
    for band, tokens in zip(plan.bands, tokens_table):
        assert band["tokens"] == pytest.approx(tokens, rel=0.01)
    assert plan.tokens == pytest.approx(tokens_table[0], rel=0.01)  # rounded to whole steps
    assert plan.batch_seqs == pytest.approx(batch_table, rel=0.05)


def test_batch_law_defaults_fit_celerity_table():
    d20 = np.array([20 * params.count_params(presets.preset(n)) for n in CELERITY])
    batch_tokens = np.array([b * 8192 for _, b, _ in CELERITY.values()])
    exponent, _ = np.polyfit(np.log(d20), np.log(batch_tokens), 1)
    defaults = RecipeConfig()
    assert exponent == pytest.approx(defaults.batch_law_exponent, abs=0.02)
    coef_at_default_exponent = np.exp(np.mean(np.log(batch_tokens / d20**defaults.batch_law_exponent)))
    assert coef_at_default_exponent == pytest.approx(defaults.batch_law_coef, rel=0.02)


def test_batch_law_uses_own_budget_when_batch_law_tpp_is_none():
    cfg = presets.preset("celerity-300m")
    fixed = recipe.make_plan(cfg, RecipeConfig(tpp=80))
    grown = recipe.make_plan(cfg, RecipeConfig(tpp=80, batch_law_tpp=None))
    assert fixed.batch_seqs == recipe.make_plan(cfg, RecipeConfig(tpp=20)).batch_seqs
    assert grown.batch_seqs == pytest.approx(2 * fixed.batch_seqs, rel=0.1)  # B ∝ sqrt(D)


def test_plan_pins_tau_and_derives_weight_decay():
    plan = recipe.make_plan(presets.preset("celerity-300m"), RecipeConfig(tpp=80))
    assert plan.tau == pytest.approx(recipe.tau_law(80))
    assert recipe.tau_from(plan.batch_tokens, plan.lr_hidden, plan.weight_decay, plan.tokens) == \
        pytest.approx(plan.tau, rel=1e-12)
    assert plan.lr_hidden == pytest.approx(0.15 * 256 / 640)  # η_base / m_d
    assert plan.lr_peak == {"embedding": 0.15, "hidden": plan.lr_hidden, "block_vector": 0.15,
                            "final_norm": 0.15, "unembedding": 0.15}
    # Keeping τ fixed while the batch changes moves λ ∝ B (at the same tokens).
    double = recipe.make_plan(presets.preset("celerity-300m"),
                              RecipeConfig(tpp=80, batch_seqs=2 * plan.batch_seqs))
    assert double.weight_decay == pytest.approx(2 * plan.weight_decay, rel=0.001)


def test_default_convention_derives_lambda_as_before():
    plan = recipe.make_plan(presets.preset("celerity-300m"), RecipeConfig())
    assert plan.decay_convention == "per_lr"
    assert plan.weight_decay == recipe.weight_decay_for_tau(plan.batch_tokens, plan.lr_hidden, plan.tau, plan.tokens)


# (preset, m_d): Celerity's smallest and largest widths, d_base 256.
WIDTHS = [("celerity-300m", 2.5), ("celerity-3.9b", 8.0)]


@pytest.mark.parametrize("name, m_d", WIDTHS)
def test_both_conventions_give_the_hidden_matrices_the_same_tau(name, m_d):
    per_lr, width_scaled = (recipe.make_plan(presets.preset(name), RecipeConfig(decay_convention=c))
                            for c in ("per_lr", "width_scaled"))
    assert width_scaled.tau == per_lr.tau == recipe.tau_law(20)
    assert width_scaled.weight_decay == pytest.approx(per_lr.weight_decay / m_d, rel=1e-12)  # λ = B/(η·m_d·τ·D)
    assert width_scaled.weight_decay_mult == {"embedding": 1.0, "hidden": m_d, "block_vector": 0.0,
                                              "final_norm": 0.0, "unembedding": 1.0}
    hidden_decay = per_lr.lr_hidden * per_lr.weight_decay
    assert width_scaled.lr_hidden * m_d * width_scaled.weight_decay == pytest.approx(hidden_decay, rel=1e-12)
    assert hidden_decay == pytest.approx(1 / (per_lr.tau * per_lr.steps), rel=1e-12)
    tau = per_lr.tau
    # Under per_lr the embedding and unembedding (LR η_base = m_d·η_hidden) decay m_d times faster.
    assert per_lr.tau_by_role == pytest.approx({"embedding": tau / m_d, "hidden": tau, "unembedding": tau / m_d},
                                               rel=1e-12)
    assert width_scaled.tau_by_role == pytest.approx({"embedding": tau, "hidden": tau, "unembedding": tau},
                                                     rel=1e-12)


def test_width_scaled_with_a_fixed_lambda_shortens_tau_by_m_d():
    fixed = dataclasses.replace(TINY_RECIPE, weight_decay=0.1)
    cfg = presets.preset("tiny-d128")  # m_d = 128/32 = 4
    per_lr = recipe.make_plan(cfg, fixed)
    width_scaled = recipe.make_plan(cfg, dataclasses.replace(fixed, decay_convention="width_scaled"))
    assert width_scaled.weight_decay == per_lr.weight_decay == 0.1
    assert width_scaled.tau == pytest.approx(per_lr.tau / 4, rel=1e-12)
    assert width_scaled.tau_by_role["embedding"] == pytest.approx(per_lr.tau_by_role["embedding"], rel=1e-12)


def test_fixed_weight_decay_lets_tau_follow():
    plan = recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, weight_decay=0.1))
    assert plan.weight_decay == 0.1
    assert plan.tau == pytest.approx(recipe.tau_from(plan.batch_tokens, plan.lr_hidden, 0.1, plan.tokens))
    with pytest.raises(ConfigError, match="RecipeConfig.weight_decay .* together with RecipeConfig.tau"):
        RecipeConfig(weight_decay=0.1, tau=0.2)


def test_adam_b2_from_a_half_life_in_t_hat_spans_the_same_fraction_of_every_run():
    assert recipe.make_plan(TINY, TINY_RECIPE).adam_b2 == 0.95  # the default leaves β2 as given
    for tpp in (5.0, 20.0):
        plan = recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, tpp=tpp, adam_b2_half_life=0.02))
        assert plan.adam_b2 ** (0.02 * plan.steps) == pytest.approx(0.5)
    short, long_ = (recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, tpp=t, adam_b2_half_life=0.02)).adam_b2
                    for t in (5.0, 20.0))
    assert short < long_ < 1


def test_warmup_rule():
    celerity = recipe.make_plan(presets.preset("celerity-300m"), RecipeConfig())
    assert celerity.warmup_steps == round(375e6 / celerity.batch_tokens)  # 10% would be 541M tokens
    tiny = recipe.make_plan(TINY, TINY_RECIPE)
    assert tiny.warmup_steps == round(0.1 * tiny.steps)
    short = recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, warmup_tokens=1024))
    assert short.warmup_steps == 2  # 1024 tokens / 512 per step


def test_flops_and_steps():
    plan = recipe.make_plan(TINY, TINY_RECIPE)
    assert plan.steps == round(20 * plan.n_params / plan.batch_tokens)
    assert plan.tokens == plan.steps * plan.batch_tokens
    assert plan.train_flops == pytest.approx(plan.flops_per_token * plan.tokens)
    assert plan.train_flops > 6 * plan.n_params * plan.tokens  # 6ND plus attention
    for band in plan.bands:
        assert band["flops"] == pytest.approx(plan.flops_per_token * band["tpp"] * plan.n_params)


def test_plan_to_json_round_trip():
    plan = recipe.make_plan(TINY, TINY_RECIPE)
    restored = json.loads(plan.to_json())
    assert restored == json.loads(json.dumps(plan.to_dict()))
    assert restored["weight_decay"] == plan.weight_decay and restored["steps"] == plan.steps
    assert restored["bands"][1]["tpp"] == 80.0
    assert restored["decay_convention"] == "per_lr" and restored["tau_by_role"]["hidden"] == pytest.approx(plan.tau)


@pytest.mark.parametrize("field, value", [
    ("tau", 0.0), ("tau", -0.1), ("tpp", 0.0), ("base_lr", -1.0), ("batch_seqs", 0),
    ("seq_len", 0), ("warmup_frac", 1.0), ("schedule", "linear"), ("batch_seqs", 8.0),
    ("adam_b2", 1.0), ("adam_b2_half_life", 0.0), ("adam_b2_half_life", 1.0), ("bands", ()), ("weight_decay", 0.0), ("decay_convention", "equal_rate"),
])
def test_bad_recipe_fields_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"RecipeConfig.{field}"):
        RecipeConfig(**{field: value})


@pytest.mark.parametrize("kwargs", [dict(batch_tokens=0.0), dict(lr=-1.0), dict(tokens=0.0),
                                    dict(weight_decay=0.0)])
def test_tau_from_rejects_non_positive(kwargs):
    args = dict(batch_tokens=1e6, lr=1e-3, weight_decay=0.1, tokens=1e9) | kwargs
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        recipe.tau_from(**args)


def test_warmup_longer_than_training():
    with pytest.raises(ConfigError, match="warmup_frac"):
        recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, batch_seqs=1000, warmup_frac=0.98))


def test_batch_larger_than_budget():
    with pytest.raises(ConfigError, match="batch_seqs"):
        recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, batch_seqs=20_000))


def test_decay_that_would_flip_weights():
    # 4 steps at τ = 0.1: λ·η_hidden = 1/(τ·T) = 2.5.
    with pytest.raises(ConfigError, match="λ·η = .* >= 1"):
        recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, batch_seqs=4096, tau=0.1))


def test_seq_len_longer_than_model_context():
    at_max = dataclasses.replace(TINY_RECIPE, seq_len=TINY.max_seq_len)
    assert recipe.make_plan(TINY, at_max).seq_len == TINY.max_seq_len
    with pytest.raises(ConfigError, match=f"seq_len = {TINY.max_seq_len + 1} exceeds ModelConfig.max_seq_len"):
        recipe.make_plan(TINY, dataclasses.replace(TINY_RECIPE, seq_len=TINY.max_seq_len + 1))


@pytest.mark.parametrize("preset", CELERITY)
def test_celerity_gin_files_match_presets_and_paper(preset):
    batch = CELERITY[preset][1]
    size = preset.removeprefix("celerity-")
    for tpp in (20, 80, 234):
        configs = gin_config.parse_gin([str(CELERITY_DIR / f"{size}_{tpp}tpp.gin")])
        assert configs.model == presets.preset(preset)
        assert configs.recipe.tpp == tpp and configs.recipe.batch_seqs == batch
