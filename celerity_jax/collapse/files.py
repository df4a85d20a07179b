"""What the collapse toolkit reads and writes: curve files, reference JSON and surrogate JSON.

A CURVE is one of:
- a run directory holding `curve.csv` (step, tokens, frac, loss) and `plan.json`;
- a TensorBoard event directory (scalar `train/loss`; t̂ from `progress/frac` or from the total steps),
  with `plan.json` in it or in one of its two parents, if any;
- a CSV file whose header holds `step` and `loss` (optional `tokens`, `frac`), with an optional sidecar
  `<name>.json` beside it giving the controls.
Each holds a training-loss curve and may hold an eval-loss curve (the loss on fixed held-out batches),
read with `loss="eval"`: `eval.csv` in a run directory, the scalar `eval/loss` in events, or an
`eval_loss` column in a CSV (rows with an empty cell skipped).
Controls are read by key (controls.controls_from_mapping), so plan.json may hold more.

A reference JSON holds a `Reference` (types.py; built by reference.py), a surrogate JSON the constants fitted by
surrogate.py. Every reader turns a bad file into a one-line ConfigError naming the file and the fix.
"""

import csv
import dataclasses
import decimal
import importlib.resources
import json
import os

import numpy as np

from celerity_jax.collapse import surrogate
from celerity_jax.collapse.controls import JSON_TYPES, MAX_STEP, controls_from_mapping
from celerity_jax.collapse.types import Curve, Reference
from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_input_file, write_json_atomic
from celerity_jax.rundir import CURVE_CSV, LOSS_CSV, PLAN_JSON

LOSS_TAG = {"train": "train/loss", "eval": "eval/loss"}
LOSS_COLUMN = {"train": "loss", "eval": "eval_loss"}
FRAC_TAG = "progress/frac"
CURVE_KINDS = "a run directory, a TensorBoard event directory or a curve .csv file"
REFERENCE_FORMAT = "celerity-collapse-reference/1"
SURROGATE_FORMAT = "celerity-collapse-surrogate/1"
# `--surrogate default` names the constants shipped with the package (fitted by experiments/surrogate/).
DEFAULT_SURROGATE = "default"
DEFAULT_SURROGATE_FILE = "default_surrogate.json"


def check_curve_path(path: str, flag: str = "CURVE") -> None:
    """`path` exists and is a readable directory or .csv file (what load_curve reads), else one-line ConfigError."""
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise ConfigError(f"{flag} {path} is a directory that cannot be read; fix its permissions")
    elif path.endswith(".csv"):
        check_input_file(path, flag)
    elif os.path.exists(path):
        raise ConfigError(f"{flag} {path} is not {CURVE_KINDS} (see the collapse README for the curve formats)")
    else:
        raise ConfigError(f"{flag} {path} does not exist; give {CURVE_KINDS}")


def load_curve(path: str, total_steps: int | None = None, loss: str = "train") -> Curve:
    """Reads and checks one CURVE (see the module docstring), its training (`loss="train"`) or eval loss;
    bad input raises ConfigError."""
    if loss not in LOSS_CSV:
        raise ConfigError(f"the loss curve {loss!r} is not one of {tuple(LOSS_CSV)}")
    path = os.path.normpath(path)
    check_curve_path(path)
    meta_path = None
    if os.path.isdir(path):
        name = os.path.basename(os.path.abspath(path))
        if os.path.isfile(os.path.join(path, CURVE_CSV)):
            source = os.path.join(path, LOSS_CSV[loss])
            if not os.path.isfile(source):
                raise ConfigError(f"{path} has no {LOSS_CSV[loss]}: the run recorded no eval loss; train it with "
                                  "TrainConfig.eval_every or eval_points, or use the training curve")
            step_T, loss_T, frac_T = _read_csv(source)
            candidates = [path]
        else:
            source = path
            step_T, loss_T, frac_T = _read_events(path, loss)
            parent = os.path.dirname(os.path.abspath(path))
            candidates = [path, parent, os.path.dirname(parent)]
        meta_path = next((os.path.join(d, PLAN_JSON) for d in candidates
                          if os.path.isfile(os.path.join(d, PLAN_JSON))), None)
    else:
        source, name = path, os.path.basename(path)[:-4]
        step_T, loss_T, frac_T = _read_csv(path, LOSS_COLUMN[loss])
        if os.path.isfile(path[:-4] + ".json"):
            meta_path = path[:-4] + ".json"
    meta = read_json(meta_path) if meta_path else {}
    controls, meta_steps = controls_from_mapping(meta, meta_path or source)
    _check_values(source, step_T, loss_T, frac_T)
    if total_steps is not None:
        frac_T, total_from = None, "given"
    elif meta_steps:
        total_steps, total_from = meta_steps, meta_path
    elif frac_T is not None and frac_T[-1] > 0:
        total_steps, total_from = int(round(step_T[-1] / frac_T[-1])), "frac column"
    else:
        total_steps, total_from = int(step_T[-1]), "last step"  # a finished curve ends at its last step
    if total_steps < step_T[-1] or total_steps < 1:
        raise ConfigError(f"{source}: the total step count {total_steps} is smaller than the curve, whose "
                          f"last step is {int(step_T[-1])}; pass the run's real total steps")
    if frac_T is None:
        frac_T = step_T / total_steps
    return Curve(name, source, step_T, loss_T, frac_T, int(total_steps), total_from, controls, loss)


def _step(text: str) -> int | None:
    """The whole number in [0, MAX_STEP] written in `text` ('120', '1.2e2', '120.0'), exactly; else None."""
    try:
        value = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None
    if not value.is_finite() or not 0 <= value <= MAX_STEP or value != value.to_integral_value():
        return None
    return int(value)


def _read_csv(path: str, loss_column: str = "loss") -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            lines = [(i, r) for i, r in enumerate(csv.reader(f), start=1) if r]
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text CSV (no UTF-8 at byte {e.start}); a curve CSV is text with a "
                          "header holding 'step' and 'loss'") from e
    except csv.Error as e:
        raise ConfigError(f"{path}: not a text CSV ({e}); a curve CSV is text with a header holding 'step' and "
                          "'loss'") from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror}); fix its permissions or give another file") from e
    if not lines:
        raise ConfigError(f"{path}: empty file; a curve CSV needs a header with 'step' and 'loss'")
    header = [h.strip().lower() for h in lines[0][1]]
    missing = [c for c in ("step", loss_column) if c not in header]
    if missing:
        raise ConfigError(f"{path}: the header {lines[0][1]} lacks column(s) {missing}; a curve CSV needs "
                          f"'step' and {loss_column!r} (optional 'tokens', 'frac')")
    if loss_column != "loss":  # an eval column is filled at the evaluated steps only
        col = header.index(loss_column)
        lines = lines[:1] + [(i, r) for i, r in lines[1:] if col < len(r) and r[col].strip()]
    if len(lines) < 2:
        raise ConfigError(f"{path}: no data rows under the header")
    cols = {c: header.index(c) for c in ("step", loss_column, "frac") if c in header}
    step_T = np.empty(len(lines) - 1, np.int64)
    values = {c: np.empty(len(lines) - 1) for c in cols if c != "step"}
    for row_index, (line, row) in enumerate(lines[1:]):
        cells = {c: row[i] if i < len(row) else "missing" for c, i in cols.items()}
        step = _step(cells["step"])
        if step is None:
            raise ConfigError(f"{path}, line {line}: 'step' is {cells['step']!r}, not a whole number >= 0 "
                              "(and below 2**63)")
        step_T[row_index] = step
        for c in values:
            try:
                values[c][row_index] = float(cells[c])
            except ValueError:
                raise ConfigError(f"{path}, line {line}: {c!r} is {cells[c]!r}, not a number") from None
    return step_T, values[loss_column], values.get("frac")


def _read_events(path: str, loss: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    dirs = sorted({root for root, _, files in os.walk(path) if any("tfevents" in f for f in files)})
    series = {}
    for d in dirs:
        acc = event_accumulator.EventAccumulator(
            d, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in (LOSS_TAG[loss], FRAC_TAG):
            events = [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] if tag in tags["scalars"] else []
            if tag in tags["tensors"]:  # scalars written as tensors (tensorboard.summary.Writer)
                events += [(e.wall_time, e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                           for e in acc.Tensors(tag)]
            # A restarted run logs some steps twice: the latest write of a step wins.
            series.setdefault(tag, {}).update({s: v for _, s, v in sorted(events)})
    tag = LOSS_TAG[loss]
    if not series.get(tag):
        raise ConfigError(f"{path}: no {CURVE_CSV} and no TensorBoard scalar {tag!r} under it; "
                          "give a run directory, an event directory or a CSV")
    step_T = np.array(sorted(series[tag]), np.int64)
    loss_T = np.array([series[tag][s] for s in step_T])
    fracs = series.get(FRAC_TAG, {})
    frac_T = np.array([fracs[s] for s in step_T]) if all(s in fracs for s in step_T) else None
    return step_T, loss_T, frac_T


def _check_values(source: str, step_T: np.ndarray, loss_T: np.ndarray, frac_T: np.ndarray | None) -> None:
    bad = np.flatnonzero(step_T < 0)
    if bad.size:
        raise ConfigError(f"{source}: step {step_T[bad[0]]} (data row {bad[0] + 1}) is negative; steps count from 0")
    back = np.flatnonzero(np.diff(step_T) <= 0)
    if back.size:
        i = back[0] + 1
        kind = "a duplicate" if step_T[i] == step_T[i - 1] else "decreasing"
        raise ConfigError(f"{source}: step {int(step_T[i])} (data row {i + 1}) follows step {int(step_T[i - 1])}: "
                          f"{kind} step; steps must increase strictly (drop the rows of a restarted "
                          "segment that were trained again)")
    bad = np.flatnonzero(~np.isfinite(loss_T))
    if bad.size:
        raise ConfigError(f"{source}: the loss at step {int(step_T[bad[0]])} (data row {bad[0] + 1}) is "
                          f"{loss_T[bad[0]]}; curves need finite losses (cut the curve before that step)")
    bad = np.flatnonzero(loss_T <= 0)
    if bad.size:
        raise ConfigError(f"{source}: the loss at step {int(step_T[bad[0]])} is {loss_T[bad[0]]}; "
                          "normalization needs positive losses")
    if frac_T is not None:
        bad = np.flatnonzero(~np.isfinite(frac_T) | (frac_T < 0) | (frac_T > 1))
        if bad.size:
            raise ConfigError(f"{source}: frac at step {int(step_T[bad[0]])} is {frac_T[bad[0]]}, "
                              "outside [0, 1]")


def read_json(path: str, file_format: str | None = None, made_by: str = "") -> dict:
    """A JSON object from `path` (with "format" = `file_format` if given, a file written by the command
    `made_by`), or a one-line ConfigError naming the file, the problem and the fix."""
    check_input_file(path, "the file")
    fix = f"give a file made by `{made_by}`" if made_by else "fix or remove the file"
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8-sig"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror}); {fix}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a JSON text file (no UTF-8 at byte {e.start}); {fix}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e}); {fix}") from e
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to read; {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: holds {JSON_TYPES[type(data)]}, where a JSON object is expected; {fix}")
    if file_format and data.get("format") != file_format:
        raise ConfigError(f"{path}: format {data.get('format')!r}, expected {file_format!r}; {fix}")
    return data


def _floats(x: np.ndarray) -> list[float]:
    return [float(f"{v:.7g}") for v in np.asarray(x, float)]


def save_reference(ref: Reference, path: str) -> None:
    data = {"format": REFERENCE_FORMAT, "controls": ref.controls.to_dict(), "offset": ref.offset,
            "final_loss": ref.final_loss, "provenance": ref.provenance, "frac": _floats(ref.frac_G),
            "normalized_loss": _floats(ref.normalized_G)}
    if ref.seed_std_G is not None:
        data["seed_std"] = _floats(ref.seed_std_G)
    write_json_atomic(path, data)


def _float_array(data: dict, key: str, path: str, fix: str) -> np.ndarray:
    """data[key], a list of finite numbers, as an array; else a one-line ConfigError."""
    if key not in data:
        raise ConfigError(f"{path}: the reference has no {key!r}; {fix}")
    try:
        array = np.asarray(data[key], float)
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is None or array.ndim != 1 or not np.all(np.isfinite(array)):
        raise ConfigError(f"{path}: {key!r} is not a list of finite numbers; {fix}")
    return array


def load_reference(path: str) -> Reference:
    """The reference JSON at `path`; a file that is not one, or is damaged, is a one-line ConfigError."""
    fix = "rebuild it with `celerity collapse reference`"
    data = read_json(path, REFERENCE_FORMAT, "celerity collapse reference")
    frac_G = _float_array(data, "frac", path, fix)
    normalized_G = _float_array(data, "normalized_loss", path, fix)
    seed_std_G = _float_array(data, "seed_std", path, fix) if "seed_std" in data else None
    if (frac_G.size < 2 or np.any(np.diff(frac_G) <= 0) or normalized_G.shape != frac_G.shape
            or np.any(normalized_G <= 0) or (seed_std_G is not None and seed_std_G.shape != frac_G.shape)):
        raise ConfigError(f"{path}: 'frac' must increase and match 'normalized_loss' (positive) and 'seed_std' "
                          f"in length; {fix}")
    offset = data.get("offset", 0.0)
    # abs(offset) < 1e300 also refuses nan, inf and ints too large for a float
    if isinstance(offset, bool) or not isinstance(offset, int | float) or not abs(offset) < 1e300:
        raise ConfigError(f"{path}: 'offset' = {offset!r} is not a finite number; {fix}")
    controls, _ = controls_from_mapping(data.get("controls", {}), path, fix)
    return Reference(frac_G, normalized_G, seed_std_G, controls, float(offset), data.get("final_loss"),
                     data.get("provenance", {}), path)


def save_surrogate(fit: surrogate.SurrogateFit, curve_info: list[dict], fit_range: tuple[float, float],
                   provenance: dict, path: str) -> None:
    """Writes the fitted constants, the MAE per curve (with `curve_info`) and overall."""
    write_json_atomic(path, {
        "format": SURROGATE_FORMAT, "constants": dataclasses.asdict(fit.constants),
        "fixed": {"eps1": surrogate.EPS1, "eps2": surrogate.EPS2, "m": surrogate.M}, "fit_range": list(fit_range),
        "mae": fit.mae, "curves": [dict(info, mae=float(m)) for info, m in zip(curve_info, fit.mae_C)],
        "provenance": provenance})


def load_surrogate(path: str) -> surrogate.SurrogateConstants:
    data = read_json(path, SURROGATE_FORMAT, "celerity collapse fit")
    try:
        return surrogate.SurrogateConstants(**{k: float(data["constants"][k]) for k in ("b_c", "b_e", "q_c", "q_e")})
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: malformed surrogate constants ({e!r}); refit it") from e


def fit_range_notes(path: str, tau: float, tpp: float) -> list[str]:
    """Notes when τ or TPP lie outside the values of the curves the surrogate in `path` was fitted on."""
    fitted = read_json(path, SURROGATE_FORMAT, "celerity collapse fit").get("curves", [])
    notes = []
    for name, value in (("tau", tau), ("tpp", tpp)):
        values = [c[name] for c in fitted if isinstance(c, dict) and isinstance(c.get(name), int | float)]
        if values and not min(values) <= value <= max(values):
            notes.append(f"{name} = {value:g} is outside the fitted runs' range [{min(values):g}, {max(values):g}] "
                         f"of {path}; the surrogate extrapolates")
    return notes


def default_surrogate_path() -> str:
    """The surrogate file shipped with the package (see its "provenance")."""
    return str(importlib.resources.files("celerity_jax.collapse") / DEFAULT_SURROGATE_FILE)


def surrogate_path(name: str) -> str:
    """`default` → the shipped file; anything else is a path."""
    return default_surrogate_path() if name == DEFAULT_SURROGATE else name


def default_surrogate() -> surrogate.SurrogateConstants:
    """The shipped constants, fitted to the project's tiny runs (not to LLM-scale runs)."""
    return load_surrogate(default_surrogate_path())
