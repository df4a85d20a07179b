"""A run's identity: what run.json holds, and which identities read back name the same run."""

import dataclasses
import json

from celerity_jax import recipe
from celerity_jax.rundir.identity import SECTIONS, Identity, diff


def _identity(configs) -> Identity:
    return Identity.of(configs, recipe.make_plan(configs.model, configs.recipe))


def test_the_identity_holds_four_configs_and_the_plan_as_json(tiny_configs):
    configs = tiny_configs()
    identity = _identity(configs)
    assert list(identity.record) == [*SECTIONS, "plan"]
    assert identity.record == json.loads(json.dumps(identity.record))  # compares equal to run.json read back
    assert identity.record["monitor"]["align_window"] == list(configs.monitor.align_window)
    assert identity.defaults["monitor"] == json.loads(json.dumps(dataclasses.asdict(type(configs.monitor)())))
    assert _identity(tiny_configs("TrainConfig.log_every = 7")) == identity  # TrainConfig is not part of it


def test_a_config_field_added_since_counts_as_equal_at_its_class_default(tiny_configs):
    identity = _identity(tiny_configs())
    older = json.loads(json.dumps(identity.record))
    del older["monitor"]["stop_on_alert"]  # as if written before MonitorConfig.stop_on_alert existed
    assert identity.same_run(older) and identity.differences(older) == []
    stops = _identity(tiny_configs("MonitorConfig.stop_on_alert = True"))
    assert not stops.same_run(older)
    assert stops.differences(older) == ["monitor.stop_on_alert: None -> True"]
    assert not identity.same_run({**older, "plan": {}})  # a plan key is never filled


def test_diff_names_every_changed_leaf():
    assert diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3, "d": 4}}) == ["a.c: 2 -> 3", "a.d: None -> 4"]
