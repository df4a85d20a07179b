"""End-to-end trainer tests on the smallest tiny model (a few dozen steps each)."""

import csv
import json
import os
import re
import signal
import time

import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.configs import RunDefinition
from celerity_jax.errors import ConfigError
from celerity_jax.model import transformer
from celerity_jax.train import loop


def test_run_directory_holds_config_plan_events_curve_and_checkpoints(tmp_path, tiny_configs, curve_losses):
    workdir = str(tmp_path / "run")
    configs = tiny_configs("TrainConfig.stop_at_step = 20", "TrainConfig.eval_points = 10")
    summary = loop.train(RunDefinition.of(configs, "# op\n"), workdir, log=lambda _: None)
    assert summary["final_step"] == 20 and summary["stopped"] == "stop_at_step"
    names = set(os.listdir(workdir))
    assert {"config.gin", "plan.json", "run.json", "curve.csv", "checkpoints"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    with open(os.path.join(workdir, "plan.json")) as f:
        plan = json.load(f)
    losses = curve_losses(workdir)
    assert sorted(losses) == list(range(1, 21))
    with open(os.path.join(workdir, "curve.csv")) as f:
        row = list(csv.DictReader(f))[9]
    assert int(row["tokens"]) == 10 * plan["batch_tokens"]
    assert float(row["frac"]) == 10 / plan["steps"]
    with open(os.path.join(workdir, "eval.csv")) as f:
        evals = [int(r["step"]) for r in csv.DictReader(f)]
    points = configs.train.eval_steps(plan["steps"])
    assert evals == sorted({10, 20} | {s for s in points if s <= 20}) and len(evals) > 2

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(workdir)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("train/loss", "train/loss_smooth", "eval/loss", "opt/lr", "opt/weight_decay", "opt/tau",
                "opt/grad_norm", "opt/param_norm", "opt/update_rms_ratio/hidden", "perf/tokens_per_sec",
                "perf/step_time", "perf/model_flops_per_sec", "progress/frac"):
        assert tag in tags, tag
    assert len(events.Scalars("train/loss")) == 20
    assert "config/operative_gin" in events.Tags()["tensors"]
    assert events.Tags()["images"] == []  # the collapse figure needs a reference


def test_workdir_with_another_run_is_refused_then_archived_with_force_new(tmp_path, tiny_run):
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.stop_at_step = 5"), workdir, log=lambda _: None)
    before = sorted(os.listdir(workdir))
    with pytest.raises(ConfigError, match="ModelConfig|model.d_model|different run"):
        loop.train(tiny_run("ModelConfig.d_model = 64", "ModelConfig.n_heads = 4",
                            "TrainConfig.stop_at_step = 5"), workdir, log=lambda _: None)
    assert sorted(os.listdir(workdir)) == before
    loop.train(tiny_run("ModelConfig.d_model = 64", "ModelConfig.n_heads = 4", "TrainConfig.stop_at_step = 5"),
               workdir, force_new=True, log=lambda _: None)
    archived = [n for n in os.listdir(workdir) if n.startswith("archived-")]
    assert len(archived) == 1
    assert sorted(os.listdir(os.path.join(workdir, archived[0]))) == [n for n in before if n != "run.lock"]
    with open(os.path.join(workdir, "run.json")) as f:
        assert json.load(f)["model"]["d_model"] == 64


def _nan_when_first_target_even(monkeypatch):
    real = transformer.next_token_loss

    def faulty(cfg, params, inputs, targets, **kwargs):
        total, aux = real(cfg, params, inputs, targets, **kwargs)
        bad = targets[0, 0] % 2 == 0
        aux = dict(aux, cross_entropy=jnp.where(bad, jnp.nan, aux["cross_entropy"]))
        return jnp.where(bad, jnp.nan, total), aux

    monkeypatch.setattr(transformer, "next_token_loss", faulty)


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, tiny_run):
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.stop_at_step = 10"), workdir, log=lambda _: None)
    ckpt = os.path.join(workdir, "checkpoints")
    before = sorted(os.listdir(ckpt))
    _nan_when_first_target_even(monkeypatch)
    with pytest.raises(loop.TrainingDiverged, match=r"not finite at step 1\d") as err:
        loop.train(tiny_run(), workdir, log=lambda _: None)
    assert "last good checkpoint (step 10) is untouched" in str(err.value)
    assert sorted(os.listdir(ckpt)) == before


def _always_nan(monkeypatch):
    real = transformer.next_token_loss

    def faulty(cfg, params, inputs, targets, **kwargs):
        total, aux = real(cfg, params, inputs, targets, **kwargs)
        return total * jnp.nan, dict(aux, cross_entropy=aux["cross_entropy"] * jnp.nan)

    monkeypatch.setattr(transformer, "next_token_loss", faulty)


@pytest.mark.slow  # 9 s
def test_nan_loss_from_the_first_step_after_a_restore_blames_the_checkpoint(tmp_path, monkeypatch, tiny_run):
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.stop_at_step = 10"), workdir, log=lambda _: None)
    _always_nan(monkeypatch)
    with pytest.raises(loop.TrainingDiverged, match="since resuming from the checkpoint at step 10 .* may be "
                                                    "corrupt") as err:
        loop.train(tiny_run(), workdir, log=lambda _: None)
    assert "Lower the LR" not in str(err.value)


def test_nan_loss_before_any_checkpoint_says_so(tmp_path, monkeypatch, tiny_run):
    _always_nan(monkeypatch)
    with pytest.raises(loop.TrainingDiverged, match="no checkpoint had been saved") as err:
        loop.train(tiny_run(), str(tmp_path / "run"), log=lambda _: None)
    assert "None" not in str(err.value)


def _scalar_at(workdir, tag, step):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(workdir))
    events.Reload()
    return next(e.value for e in events.Scalars(tag) if e.step == step)


def test_bad_steps_can_be_skipped_and_the_schedule_stays_on_time(tmp_path, monkeypatch, curve_losses, tiny_run):
    clean = str(tmp_path / "clean")
    loop.train(tiny_run("TrainConfig.stop_at_step = 20"), clean, log=lambda _: None)
    _nan_when_first_target_even(monkeypatch)
    workdir = str(tmp_path / "run")
    summary = loop.train(tiny_run("TrainConfig.max_bad_steps = 1000", "TrainConfig.stop_at_step = 20"),
                         workdir, log=lambda _: None)
    assert summary["final_step"] == 20
    losses = curve_losses(workdir)  # skipped steps have no row in curve.csv
    assert 0 < len(losses) < 20 and all(np.isfinite(v) and v < 6.0 for v in losses.values())
    assert summary["skipped_steps"] == 20 - len(losses)
    assert _scalar_at(workdir, "opt/lr", 20) == _scalar_at(clean, "opt/lr", 20)


MIXTURES = {"hash": ("ModelConfig.n_experts = 4", "ModelConfig.router = 'hash'"),
            "topk": ("ModelConfig.n_experts = 4", "ModelConfig.experts_per_token = 2")}


@pytest.mark.parametrize("model", [(), *(pytest.param(b, marks=pytest.mark.slow, id=k) for k, b in MIXTURES.items())],
                         ids=["dense", *MIXTURES])
def test_resume_after_sigkill_reproduces_the_uninterrupted_losses(model, tmp_path, curve_losses, celerity_train):
    steps = (*model, "TrainConfig.stop_at_step = 60", "TrainConfig.checkpoint_every = 10")
    full = celerity_train(tmp_path / "full", *steps)
    assert full.wait(timeout=300) == 0, full.stdout.read()
    killed_dir = tmp_path / "killed"
    killed = celerity_train(killed_dir, *steps)
    deadline = time.time() + 300
    while not (killed_dir / "checkpoints" / "20" / "commit_success.txt").exists():
        assert killed.poll() is None and time.time() < deadline, killed.stdout.read()
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL  # killed mid-run, not finished
    resumed = celerity_train(killed_dir, *steps)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out
    resumed_at = int(re.search(r"resumed from the checkpoint at step (\d+)", out).group(1))
    assert 20 <= resumed_at < 60
    expected, got = curve_losses(tmp_path / "full"), curve_losses(killed_dir)
    assert sorted(got) == list(range(1, 61))
    assert all(got[s] == expected[s] for s in range(resumed_at + 1, 61)), \
        [(s, got[s], expected[s]) for s in range(resumed_at + 1, 61)]


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path, curve_losses, celerity_train):
    workdir = tmp_path / "run"
    proc = celerity_train(workdir)
    deadline = time.time() + 300
    while not (workdir / "curve.csv").exists() or len(curve_losses(workdir)) < 5:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    assert "interrupted: saved a checkpoint" in out and "Traceback" not in out
    step = max(curve_losses(workdir))
    assert (workdir / "checkpoints" / str(step)).exists()


def test_corrupt_latest_checkpoint_falls_back_and_deletes_nothing(tmp_path, tiny_run):
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.stop_at_step = 20"), workdir, log=lambda _: None)
    latest = os.path.join(workdir, "checkpoints", "20", "state")
    for dirpath, _, files in os.walk(latest):
        for name in files:
            with open(os.path.join(dirpath, name), "r+b") as f:
                f.truncate(0)
    messages = []
    summary = loop.train(tiny_run("TrainConfig.stop_at_step = 15"), workdir, log=messages.append)
    assert summary["start_step"] == 10 and summary["final_step"] == 15
    assert any("checkpoint at step 20 is unreadable" in m and "nothing deleted" in m for m in messages)
    moved = [n for n in os.listdir(workdir) if n.startswith("corrupt-checkpoint-20")]
    assert len(moved) == 1 and os.path.isdir(os.path.join(workdir, moved[0], "state"))


@pytest.mark.slow  # 17 s
def test_in_loop_monitor_logs_collapse_metrics_against_a_reference(tmp_path, curve_losses, tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from celerity_jax.collapse import files, reference

    loop.train(tiny_run(), str(tmp_path / "ref_run"), log=lambda _: None)
    ref = reference.reference_from_curves([files.load_curve(str(tmp_path / "ref_run"))], n_bins=50, smooth_bins=3)
    files.save_reference(ref, str(tmp_path / "ref.json"))
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.seed = 1", f"TrainConfig.collapse_reference = ('{tmp_path / 'ref.json'}',)"),
               workdir, log=lambda _: None)
    events = EventAccumulator(workdir)
    events.Reload()
    for tag in ("collapse/normalized_loss", "collapse/residual", "collapse/pred_final_loss",
                "collapse/pred_final_loss_err", "collapse/alert"):
        assert tag in events.Tags()["scalars"], tag
    predictions = [e.value for e in events.Scalars("collapse/pred_final_loss") if e.value == e.value]
    assert len(predictions) >= 5  # NaN only before the alignment window has been seen
    final = float(np.mean(list(curve_losses(workdir).values())[-5:]))
    assert abs(predictions[-1] / final - 1) < 0.05


@pytest.mark.parametrize("params, match", [
    (("TrainConfig.mesh_shape = (3, 1, 1)",), "mesh_shape"),
    (("RecipeConfig.seq_len = 512",), "max_seq_len"),
    (("ModelConfig.vocab_size = 200",), "vocab"),
    (("TrainConfig.microbatches = 3",), "microbatches"),
])
def test_config_errors_stop_before_anything_is_written(tmp_path, params, match, tiny_run):
    with pytest.raises(ConfigError, match=match):
        loop.train(tiny_run(*params), str(tmp_path / "run"), log=lambda _: None)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("workdir, params", [
    ("gs://bucket/run", ()),
    ("run", ('TrainConfig.init_from = "gs://bucket/other"',)),
])
def test_url_paths_are_refused_before_anything_is_written(tmp_path, monkeypatch, workdir, params, tiny_run):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="URL.*mount"):
        loop.train(tiny_run(*params), workdir, log=lambda _: None)
    assert os.listdir(tmp_path) == []


def test_no_restorable_checkpoint_stops_and_moves_nothing(tmp_path, tiny_run):
    workdir = str(tmp_path / "run")
    loop.train(tiny_run("TrainConfig.stop_at_step = 20"), workdir, log=lambda _: None)
    for dirpath, _, files in os.walk(os.path.join(workdir, "checkpoints")):
        for name in files:
            if "state" in dirpath:
                os.truncate(os.path.join(dirpath, name), 0)
    before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
    with pytest.raises(ConfigError, match="none of the checkpoints .* could be restored"):
        loop.train(tiny_run(), workdir, log=lambda _: None)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
    assert not [n for n in os.listdir(workdir) if n.startswith("corrupt-")]


@pytest.mark.slow  # 20 s
def test_in_loop_monitor_can_follow_the_eval_curve(tmp_path, tiny_configs, tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from celerity_jax.collapse import config, curves, files, monitor, reference

    evals = ("TrainConfig.eval_points = 10", "TrainConfig.eval_every = 0", "MonitorConfig.loss_curve = 'eval'",
             "MonitorConfig.n_bins = 10", "MonitorConfig.smooth_bins = 1", "MonitorConfig.alert_m = 2")
    loop.train(tiny_run(*evals[:2]), str(tmp_path / "ref_run"), log=lambda _: None)
    ref = reference.reference_from_curves([files.load_curve(str(tmp_path / "ref_run"), loss="eval")], n_bins=10,
                                          smooth_bins=1)
    files.save_reference(ref, str(tmp_path / "ref.json"))
    workdir = str(tmp_path / "run")
    configs = tiny_configs("TrainConfig.seed = 1", f"TrainConfig.collapse_reference = ('{tmp_path / 'ref.json'}',)",
                           *evals)
    loop.train(RunDefinition.of(configs), workdir, log=lambda _: None)

    events = EventAccumulator(workdir)
    events.Reload()
    logged = events.Scalars("collapse/pred_final_loss")[-1].value
    run = files.load_curve(workdir, loss="eval")
    state = dict(zip(("loss_sum", "count"), curves.bin_curve(run.frac_T, run.loss_T, 10)))
    ref_G, _ = reference.reference_on_grid([str(tmp_path / "ref.json")], configs.monitor, run.controls)
    offline = float(monitor.monitor_metrics(state, ref_G, configs.monitor)["collapse/pred_final_loss"])
    assert logged == pytest.approx(offline, rel=1e-5)  # the monitor saw exactly eval.csv's losses
    train_curve = files.load_curve(workdir)
    train_state = dict(zip(("loss_sum", "count"), curves.bin_curve(train_curve.frac_T, train_curve.loss_T, 10)))
    assert logged != pytest.approx(float(monitor.monitor_metrics(train_state, ref_G, configs.monitor)[
        "collapse/pred_final_loss"]), rel=1e-5)

    with pytest.raises(ConfigError, match="built from eval curves"):  # an eval reference for a train-curve run
        reference.reference_on_grid([str(tmp_path / "ref.json")], config.MonitorConfig(n_bins=10, smooth_bins=1),
                                    run.controls)
