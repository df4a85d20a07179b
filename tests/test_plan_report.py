"""A plan as text: the decay convention and each role's τ."""

from celerity_jax import plan_report, recipe
from celerity_jax.model import presets
from celerity_jax.recipe import RecipeConfig


def test_plan_text_shows_the_convention_and_each_role_tau():
    cfg = presets.preset("celerity-300m")
    text = plan_report.format_plan(recipe.make_plan(cfg, RecipeConfig()))
    assert "decay convention      per_lr: every role decays at its own peak LR × λ" in text
    assert "τ                     0.1744 = B/(η_hidden·λ·D)" in text
    assert "τ embedding           0.06977 = B/(η_embedding·λ·D): decays 2.5× as fast" in text
    text = plan_report.format_plan(recipe.make_plan(cfg, RecipeConfig(decay_convention="width_scaled")))
    assert "decay convention      width_scaled: hidden matrices decay at their peak LR × m_d·λ" in text
    assert "τ                     0.1744 = B/(η_hidden·2.5·λ·D)" in text
    assert "τ unembedding         0.1744 = B/(η_unembedding·λ·D): decays 1× as fast" in text
