from celerity_jax.collapse import regime


def test_a_run_past_both_thresholds_is_in_the_regime():
    assert regime.outside(regime.MIN_STEPS, regime.MIN_TOKENS) is None
    assert regime.outside(10 * regime.MIN_STEPS, 10 * regime.MIN_TOKENS) is None


def test_a_short_run_gets_one_line_naming_what_is_short_and_the_thresholds():
    line = regime.outside(166, 169_984)
    assert "\n" not in line and "166 steps" in line and "169,984 tokens" in line
    assert f"{regime.MIN_STEPS:,} steps" in line and f"{regime.MIN_TOKENS:,} tokens" in line
    few_steps = regime.outside(regime.MIN_STEPS - 1, 10 * regime.MIN_TOKENS)
    assert f"{regime.MIN_STEPS - 1:,} steps" in few_steps and f"{10 * regime.MIN_TOKENS:,} tokens" not in few_steps
    few_tokens = regime.outside(10 * regime.MIN_STEPS, regime.MIN_TOKENS - 1)
    assert f"{regime.MIN_TOKENS - 1:,} tokens (<" in few_tokens and f"{10 * regime.MIN_STEPS:,} steps" not in few_tokens
