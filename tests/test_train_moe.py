"""A mixture of experts along the training path: its router metrics in the step, TensorBoard and the log (resume
after SIGKILL: test_train_loop.py), sampling and scoring without drops, export-hf, `celerity eval` and `celerity sample` of a run, and the planner's
active parameters."""

import dataclasses
import io
import json
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax import recipe
from celerity_jax.cli import main
from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.configs import TrainConfig
from celerity_jax.evaluate import loader, sampler, scoring
from celerity_jax.model import presets, sharding, transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.params import count_active_params, count_params
from celerity_jax.train import log_step, loop, step as step_lib
from celerity_jax.train.progress import Progress

TOPK = ("ModelConfig.n_experts = 4", "ModelConfig.experts_per_token = 2")
HASH = ("ModelConfig.n_experts = 4", "ModelConfig.router = 'hash'")
MOE_TAGS = {"moe/dropped", "moe/load_max", "moe/router_aux"}


def _one_device():
    return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


@pytest.mark.parametrize("bindings, tags", [((), set()), (HASH, MOE_TAGS - {"moe/router_aux"}), (TOPK, MOE_TAGS)],
                         ids=["dense", "hash", "topk"])
def test_the_train_step_reports_the_router_terms_averaged_over_microbatches(bindings, tags, tiny_configs):
    configs = tiny_configs(*bindings, "ModelConfig.capacity_factor = 0.5", "RecipeConfig.seq_len = 16")
    cfg = configs.model
    plan = recipe.make_plan(cfg, configs.recipe)
    build = step_lib.build_step(cfg, plan, configs.monitor, _one_device(), microbatches=2, z_loss=0.0, seed=0)
    tokens = jax.random.randint(jax.random.key(0), (plan.batch_seqs, 17), 0, cfg.vocab_size)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    state = build.init()
    params = jax.device_get(state.params)  # the step donates the state
    _, metrics = build.train_step(state, batch)
    assert {k for k in metrics if k.startswith("moe/")} == tags
    halves = [step_lib.loss_metrics(cfg, transformer.next_token_loss(cfg, params, batch["inputs"][i::2],
                                                                     batch["targets"][i::2])[1]) for i in (0, 1)]
    for tag in tags | {"train/loss"}:
        assert float(metrics[tag]) == pytest.approx((float(halves[0][tag]) + float(halves[1][tag])) / 2, rel=1e-5)
    if tags:
        assert 0 < float(metrics["moe/dropped"]) < 1 and 1 < float(metrics["moe/load_max"]) <= 4


def test_load_max_is_e_times_the_largest_load_of_any_layer_and_the_eval_loss_leaves_the_aux_loss_out():
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=64, max_seq_len=8, d_base=16,
                      n_layers_base=1, n_experts=4, experts_per_token=2, router_aux_coef=1.0)
    params = transformer.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, cfg.vocab_size)
    _, stats = transformer.apply(cfg, params, tokens, return_stats=True)
    total, terms = transformer.next_token_loss(cfg, params, tokens, tokens)
    metrics = step_lib.loss_metrics(cfg, terms)
    assert float(metrics["moe/load_max"]) == pytest.approx(4 * float(jnp.max(stats["expert_load"])))
    eval_loss = step_lib.make_eval_step(cfg)(params, {"inputs": tokens, "targets": tokens})
    assert float(eval_loss) == float(terms["cross_entropy"]) and float(total) > float(eval_loss) + 0.5


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, tiny_run):
    """A tiny top-2 mixture (capacity 1.25: routes drop) trained 10 steps: (its workdir, its log lines)."""
    workdir = str(tmp_path_factory.mktemp("moe") / "run")
    lines = []
    loop.train(tiny_run(*TOPK, "TrainConfig.stop_at_step = 10"), workdir, log=lines.append)
    return workdir, lines


def test_router_metrics_reach_tensorboard_and_the_log_states_active_parameters(moe_run, tiny_configs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir, lines = moe_run
    events = EventAccumulator(workdir)
    events.Reload()
    assert MOE_TAGS <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("moe/dropped")] == [5, 10]
    assert all(0 <= e.value < 1 for e in events.Scalars("moe/dropped"))
    assert all(1 <= e.value <= 4 for e in events.Scalars("moe/load_max"))
    cfg = tiny_configs(*TOPK).model
    assert any(f"N={count_params(cfg):,} params ({count_active_params(cfg):,} active per token)" in line
               for line in lines), lines


def test_export_hf_writes_the_mixture_as_eval_scores_it_without_drops(moe_run, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    workdir, _ = moe_run
    out = str(tmp_path / "hf")
    assert main(["export-hf", "--workdir", workdir, "--out", out]) == 0
    with open(f"{out}/config.json") as f:
        assert json.load(f)["capacity_factor"] is None
    ours = loader.load_model(workdir)
    tokens = np.asarray(jax.random.randint(jax.random.key(3), (2, 32), 0, ours.cfg.vocab_size), np.int32)
    dropless = transformer.apply(sampler.inference_config(ours.cfg), ours.params, jnp.asarray(tokens))
    assert not np.allclose(transformer.apply(ours.cfg, ours.params, jnp.asarray(tokens)), dropless, atol=1e-4)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(theirs, np.asarray(dropless), atol=1e-4)


def test_the_console_line_shows_the_dropped_fraction_of_a_mixture_only():
    plan = types.SimpleNamespace(steps=100, batch_tokens=8, flops_per_token=1.0)
    run = types.SimpleNamespace(plan=plan, configs=types.SimpleNamespace(monitor=MonitorConfig(), train=TrainConfig()))
    for metrics, shown in (({}, False), ({"moe/dropped": 0.125}, True)):
        stream = io.StringIO()
        log_step.StepLog(run, None, Progress(100, 0, stream=stream), 0).record(5, None, metrics, [jnp.float32(2.0)])
        assert ("dropped=0.125" in stream.getvalue()) == shown, stream.getvalue()


def test_eval_and_sample_score_and_continue_a_mixture_run(moe_run, capsys):
    workdir, _ = moe_run
    assert main(["eval", "--workdir", workdir, "--tasks", "stdlib_next_line", "--limit", "4", "--json"]) == 0
    score = json.loads(capsys.readouterr().out)["tasks"]["stdlib_next_line"]
    assert score["docs"] == 4 and 0.0 <= score["value"] <= 1.0
    assert main(["sample", "--workdir", workdir, "--prompt", "def ", "--max-new-tokens", "6", "--json"]) == 0
    sample = json.loads(capsys.readouterr().out)["samples"][0]
    assert 1 <= sample["new_tokens"] <= 6


def _hash_moe(capacity_factor):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, vocab_size=257, max_seq_len=64, d_base=32,
                      n_layers_base=2, n_experts=4, router="hash", capacity_factor=capacity_factor)
    return cfg, transformer.init_params(cfg, jax.random.key(1))


@pytest.mark.parametrize("capacity_factor", [None, 0.5])
def test_decoding_with_the_cache_is_the_full_forward_without_drops(capacity_factor):
    cfg, params = _hash_moe(capacity_factor)
    tokens = np.asarray(jax.random.randint(jax.random.key(2), (3, 20), 0, 257), np.int32)
    full_BxLxV = transformer.apply(dataclasses.replace(cfg, capacity_factor=None), params, jnp.asarray(tokens))
    if capacity_factor is not None:  # the trained model drops routes; sampling does not
        assert not np.allclose(transformer.apply(cfg, params, jnp.asarray(tokens)), full_BxLxV, atol=1e-3)
    decoder = sampler.Decoder(cfg, params, _one_device())
    rows, prompt_len = 3, 8
    lengths = np.asarray([8, 5, 3], np.int32)
    padded = np.where(np.arange(prompt_len)[None, :] < lengths[:, None], tokens[:, :prompt_len], 0)
    key = jax.random.key(0)
    _, logits_BxV, cache = decoder.step(decoder.new_cache(rows, 24), padded, np.zeros(rows), lengths - 1, key, 0.0,
                                        1.0)
    position = lengths.copy()
    for _ in range(6):
        np.testing.assert_allclose(np.asarray(logits_BxV), np.asarray(full_BxLxV[np.arange(rows), position - 1]),
                                   rtol=1e-5, atol=1e-5)
        fed = tokens[np.arange(rows), position][:, None]
        _, logits_BxV, cache = decoder.step(cache, fed, position, np.zeros(rows), key, 0.0, 1.0)
        position += 1


def test_a_scored_request_does_not_depend_on_the_padding_of_its_batch():
    cfg, params = _hash_moe(0.5)
    scorer = scoring.Scorer(cfg, params, _one_device(), batch_size=2)
    short = ([65] * 6, [65, 65])  # one expert takes every route: its padded batch's length would set how many drop
    long = (list(range(30, 70)), [70])
    alone = scorer.score([short])[0].logprob
    beside_a_long_one = scorer.score([short, long])[0].logprob
    assert beside_a_long_one == pytest.approx(alone, rel=1e-5)


def test_the_plan_shows_a_mixtures_active_parameters_beside_n(capsys):
    args = ["plan", "--preset", "tiny-d32", "--gin-param", "RecipeConfig.seq_len = 64"]
    assert main(args) == 0
    assert "active" not in capsys.readouterr().out
    assert main(args + ["--gin-param", "ModelConfig.n_experts = 8", "--gin-param",
                        "ModelConfig.experts_per_token = 2"]) == 0
    out = capsys.readouterr().out
    cfg = presets.preset("tiny-d32", n_experts=8, experts_per_token=2)
    n, active = count_params(cfg), count_active_params(cfg)
    assert active < n
    assert re.search(rf"N \(parameters\) +{n:,} ", out) and re.search(rf"N active per token +{active:,} ", out), out
