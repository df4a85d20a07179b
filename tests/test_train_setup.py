import os

import numpy as np

from celerity_jax.collapse import curves, files, predictor, reference
from celerity_jax.collapse.controls import Controls
from celerity_jax.collapse.types import Curve
from celerity_jax.train import setup


def _saved_reference(directory, controls: Controls, n_params: float, steps: int, shift: float) -> str:
    """A reference from one noise-free run of `steps` steps whose log normalized curve moves by shift·(1 − t̂)."""
    step_T = np.arange(1, steps + 1)
    frac_T = step_T / steps
    loss_T = 3.0 * (1.0 + 0.8 * (1.0 - frac_T)**2) * np.exp(shift * (1.0 - frac_T))
    run = Curve(f"n{n_params:g}", f"n{n_params:g}.csv", step_T, loss_T, frac_T, steps, "given",
                Controls(n_params, controls.tpp, controls.tau, controls.schedule, controls.warmup_frac))
    path = os.path.join(directory, f"n{n_params:g}.json")
    files.save_reference(reference.reference_from_curves([run], 50, 3), path)
    return path


def test_the_monitor_reference_says_its_method_and_warns_about_short_references(tmp_path, tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = []
    workdir = setup.Workdir(str(tmp_path / "run"), True, logged.append)
    assert setup._collapse_reference(tiny_run(), workdir) == (None, [])

    controls = Controls.from_plan(tiny_run().plan)
    # sizes whose tokens (TPP·N) are inside the regime; the first reference's run is 1,000 steps, too short
    paths = [_saved_reference(tmp_path, controls, n, steps, shift)
             for n, steps, shift in ((2e6, 1000, 0.0), (4e6, 2000, 0.02), (8e6, 2000, 0.04))]
    run = tiny_run(f"TrainConfig.collapse_reference = {tuple(paths)!r}")
    reference_G, lines = setup._collapse_reference(run, workdir)

    cfg = run.configs.monitor
    refs, frac_G = [files.load_reference(p) for p in paths], curves.bin_centers(cfg.n_bins)
    choice = predictor.method_for("auto", refs, frac_G, run.plan.n_params, cfg.align_window[1], cfg.align_window)
    assert choice.method == "family"  # log l is linear in log N: family predicts each held-out size exactly
    assert lines[0] == f"collapse reference: {choice.reason}" and logged == lines
    np.testing.assert_array_equal(reference_G, predictor.reference_for(refs, frac_G, run.plan.n_params, "family"))
    (warning,) = [line for line in lines if line.startswith("warning: ")]
    assert warning.startswith(f"warning: reference {paths[0]} (1,000,000 tokens, 1,000 steps): 1,000 steps (< 1,300)")

    os.makedirs(workdir.path)
    writers = setup._writers(run, workdir, setup.Start(None, 0), "", lines)
    writers.tb.close()
    events = EventAccumulator(workdir.path)
    events.Reload()
    (text,) = events.Tensors("collapse/reference")
    assert text.tensor_proto.string_val[0].decode() == setup._indented("\n".join(lines))
