"""Reading loss curves (run directories, TensorBoard event directories, CSV files) and their controls.

A CURVE is one of:
- a run directory holding `curve.csv` (step, tokens, frac, loss) and `plan.json`;
- a TensorBoard event directory (scalar `train/loss`; t̂ from `progress/frac` or from the total steps),
  with `plan.json` in it or in one of its two parents, if any;
- a CSV file whose header holds `step` and `loss` (optional `tokens`, `frac`), with an optional sidecar
  `<name>.json` beside it giving the controls.
Controls are read by key, so plan.json may hold more: n_params, tpp (or tokens), tau, schedule (a name,
or a mapping with "name"), warmup_frac (or warmup_steps), and steps / total_steps.
"""

import csv
import dataclasses
import decimal
import json
import math
import os
from collections.abc import Mapping

import numpy as np

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_input_file

CURVE_CSV = "curve.csv"
PLAN_JSON = "plan.json"
LOSS_TAG = "train/loss"
FRAC_TAG = "progress/frac"
# Relative tolerance when comparing TPP and τ of a run and a reference.
CONTROL_RTOL = 0.05
# Steps are exact int64: as floats, steps above 2**53 would round and could look equal.
MAX_STEP = np.iinfo(np.int64).max
CURVE_KINDS = "a run directory, a TensorBoard event directory or a curve .csv file"
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


@dataclasses.dataclass(frozen=True)
class Controls:
    """What a normalized curve depends on (SCIENCE.md §1). None = unknown."""
    n_params: float | None = None
    tpp: float | None = None
    tau: float | None = None
    schedule: str | None = None
    warmup_frac: float | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def mismatches(self, other: "Controls") -> list[str]:
        """Fields that collapse needs equal (TPP, τ, schedule name) and that differ; N may differ."""
        out = []
        for name in ("tpp", "tau"):
            a, b = getattr(self, name), getattr(other, name)
            if a is not None and b is not None and abs(a - b) > CONTROL_RTOL * max(abs(a), abs(b)):
                out.append(f"{name} {a:.4g} vs {b:.4g}")
        if self.schedule and other.schedule and self.schedule != other.schedule:
            out.append(f"schedule {self.schedule!r} vs {other.schedule!r}")
        return out

    def unknown(self, other: "Controls") -> list[str]:
        """Collapse controls that cannot be compared because one side does not know them."""
        return [n for n in ("tpp", "tau", "schedule") if getattr(self, n) is None or getattr(other, n) is None]


def _number(meta: Mapping, key: str, source: str, fix: str) -> float | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{source}: {key!r} = {value!r} is not a non-negative number; {fix}")
    return float(value)


def _whole_number(meta: Mapping, key: str, source: str, fix: str) -> int | None:
    """An exact count such as the total steps (a float would round counts above 2**53)."""
    value = meta.get(key)
    if value is None:
        return None
    whole = int(value) if isinstance(value, float) and value.is_integer() else value
    if isinstance(whole, bool) or not isinstance(whole, int) or not 0 <= whole <= MAX_STEP:
        raise ConfigError(f"{source}: {key!r} = {value!r} is not a whole number >= 0; {fix}")
    return whole


def controls_from_mapping(meta: Mapping, source: str, fix: str = "fix that field") -> tuple[Controls, int | None]:
    """(Controls, total steps or None) from a plan.json / sidecar mapping, read by key; `fix` ends the
    message of a field that cannot be used."""
    if not isinstance(meta, Mapping):
        raise ConfigError(f"{source}: the controls are {JSON_TYPES.get(type(meta), type(meta).__name__)}, "
                          f"not a JSON object; {fix}")
    n_params = _number(meta, "n_params", source, fix)
    tokens = _number(meta, "tokens", source, fix)
    tpp = _number(meta, "tpp", source, fix)
    if tpp is None and tokens and n_params:
        tpp = tokens / n_params
    steps = _whole_number(meta, "total_steps", source, fix)
    steps = _whole_number(meta, "steps", source, fix) if steps is None else steps
    warmup_frac = _number(meta, "warmup_frac", source, fix)
    warmup_steps = _number(meta, "warmup_steps", source, fix)
    if warmup_frac is None and warmup_steps is not None and steps:
        warmup_frac = warmup_steps / steps
    schedule = meta.get("schedule", meta.get("schedule_name"))
    if isinstance(schedule, Mapping):
        schedule = schedule.get("name")
    if schedule is not None and not isinstance(schedule, str):
        raise ConfigError(f"{source}: 'schedule' = {schedule!r} is not a schedule name; {fix}")
    controls = Controls(n_params, tpp, _number(meta, "tau", source, fix), schedule, warmup_frac)
    return controls, steps


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


@dataclasses.dataclass(frozen=True)
class Curve:
    name: str
    source: str
    step_T: np.ndarray
    loss_T: np.ndarray
    frac_T: np.ndarray
    total_steps: int
    total_from: str  # "given", the plan/sidecar path, "frac column" or "last step" (assumed finished)
    controls: Controls

    @property
    def finished(self) -> bool:
        return bool(self.step_T[-1] >= self.total_steps - 1)


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


def load_curve(path: str, total_steps: int | None = None) -> Curve:
    """Reads and checks one CURVE (see the module docstring); bad input raises ConfigError."""
    path = os.path.normpath(path)
    check_curve_path(path)
    meta_path = None
    if os.path.isdir(path):
        name = os.path.basename(os.path.abspath(path))
        if os.path.isfile(os.path.join(path, CURVE_CSV)):
            source = os.path.join(path, CURVE_CSV)
            step_T, loss_T, frac_T = _read_csv(source)
            candidates = [path]
        else:
            source = path
            step_T, loss_T, frac_T = _read_events(path)
            parent = os.path.dirname(os.path.abspath(path))
            candidates = [path, parent, os.path.dirname(parent)]
        meta_path = next((os.path.join(d, PLAN_JSON) for d in candidates
                          if os.path.isfile(os.path.join(d, PLAN_JSON))), None)
    else:
        source, name = path, os.path.basename(path)[:-4]
        step_T, loss_T, frac_T = _read_csv(path)
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
    return Curve(name, source, step_T, loss_T, frac_T, int(total_steps), total_from, controls)


def _step(text: str) -> int | None:
    """The whole number in [0, MAX_STEP] written in `text` ('120', '1.2e2', '120.0'), exactly; else None."""
    try:
        value = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None
    if not value.is_finite() or not 0 <= value <= MAX_STEP or value != value.to_integral_value():
        return None
    return int(value)


def _read_csv(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
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
    missing = [c for c in ("step", "loss") if c not in header]
    if missing:
        raise ConfigError(f"{path}: the header {lines[0][1]} lacks column(s) {missing}; a curve CSV needs "
                          "'step' and 'loss' (optional 'tokens', 'frac')")
    if len(lines) < 2:
        raise ConfigError(f"{path}: no data rows under the header")
    cols = {c: header.index(c) for c in ("step", "loss", "frac") if c in header}
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
    return step_T, values["loss"], values.get("frac")


def _read_events(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    dirs = sorted({root for root, _, files in os.walk(path) if any("tfevents" in f for f in files)})
    series = {}
    for d in dirs:
        acc = event_accumulator.EventAccumulator(
            d, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in (LOSS_TAG, FRAC_TAG):
            events = [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] if tag in tags["scalars"] else []
            if tag in tags["tensors"]:  # scalars written as tensors (tensorboard.summary.Writer)
                events += [(e.wall_time, e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                           for e in acc.Tensors(tag)]
            # A restarted run logs some steps twice: the latest write of a step wins.
            series.setdefault(tag, {}).update({s: v for _, s, v in sorted(events)})
    if not series.get(LOSS_TAG):
        raise ConfigError(f"{path}: no {CURVE_CSV} and no TensorBoard scalar {LOSS_TAG!r} under it; "
                          "give a run directory, an event directory or a CSV")
    step_T = np.array(sorted(series[LOSS_TAG]), np.int64)
    loss_T = np.array([series[LOSS_TAG][s] for s in step_T])
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
