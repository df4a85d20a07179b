import dataclasses
import types

import pytest

from celerity_jax.collapse.controls import Controls, controls_from_mapping
from celerity_jax.errors import ConfigError

CONTROLS = Controls(n_params=1e5, tpp=20.0, tau=0.17, schedule="d2z", warmup_frac=0.1)


def test_controls_from_a_plan():
    plan = types.SimpleNamespace(n_params=2e5, tpp=20.0, tau=0.3, schedule="cosine", warmup_steps=25, steps=500,
                                 wsd_decay_frac=0.2)
    assert Controls.from_plan(plan) == Controls(2e5, 20.0, 0.3, "cosine", 0.05)
    wsd = types.SimpleNamespace(**{**vars(plan), "schedule": "wsd", "wsd_decay_frac": 0.4})
    assert Controls.from_plan(wsd) == Controls(2e5, 20.0, 0.3, "wsd", 0.05, wsd_decay_frac=0.4)


def test_the_wsd_decay_fraction_travels_with_the_schedule():
    short, long = (Controls(1e5, 20.0, 0.17, "wsd", 0.1, wsd_decay_frac=d) for d in (0.2, 0.5))
    assert short.mismatches(long) == ["wsd_decay_frac 0.2 vs 0.5"]
    assert short.mismatches(dataclasses.replace(long, n_params=1e9, wsd_decay_frac=0.2)) == []
    assert Controls(schedule="cosine", wsd_decay_frac=0.5).wsd_decay_frac is None  # only wsd has the shape
    meta = {"schedule": "wsd", "wsd_decay_frac": 0.5, "tpp": 20.0}
    assert controls_from_mapping(meta, "p")[0] == Controls(tpp=20.0, schedule="wsd", wsd_decay_frac=0.5)
    assert controls_from_mapping({**meta, "schedule": "d2z"}, "p")[0] == Controls(tpp=20.0, schedule="d2z")
    assert controls_from_mapping(long.to_dict(), "ref.json")[0] == long


def test_controls_compare_collapse_fields_only():
    a = Controls(n_params=1e5, tpp=20.0, tau=0.17, schedule="d2z")
    assert a.mismatches(Controls(n_params=1e9, tpp=20.5, tau=0.17, schedule="d2z")) == []
    assert a.mismatches(Controls(tpp=40.0, tau=0.1, schedule="cosine")) == [
        "tpp 20 vs 40", "tau 0.17 vs 0.1", "schedule 'd2z' vs 'cosine'"]
    assert a.unknown(Controls(tau=0.17)) == ["tpp", "schedule"]


def test_controls_from_mapping_reads_by_key():
    plan = {"n_params": 1.0e5, "tokens": 2.0e6, "steps": 100, "tau": 0.17, "schedule": {"name": "cosine"},
            "warmup_steps": 10, "batch_tokens": 20000}
    assert controls_from_mapping(plan, "p") == (Controls(1e5, 20.0, 0.17, "cosine", 0.1), 100)
    assert controls_from_mapping({"total_steps": 7.0, "steps": 9}, "p") == (Controls(), 7)
    with pytest.raises(ConfigError, match=r"p: 'steps' = 2.5 is not a whole number >= 0; fix that field"):
        controls_from_mapping({"steps": 2.5}, "p")
    with pytest.raises(ConfigError, match=r"p: 'schedule' = 3 is not a schedule name"):
        controls_from_mapping({"schedule": 3}, "p")


def test_controls_must_be_an_object():
    with pytest.raises(ConfigError, match="ref.json: the controls are an array, not a JSON object; rebuild it"):
        controls_from_mapping([], "ref.json", "rebuild it")
