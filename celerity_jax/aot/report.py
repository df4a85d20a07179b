"""The compile report as text, and the checks `celerity compile` makes before it compiles anything."""

import os

from celerity_jax.aot.compile import StepSetting
from celerity_jax.aot.row import Row
from celerity_jax.errors import ConfigError
from celerity_jax.train.memory import fix_hint
from celerity_jax.train.step import setting_line


def check_writable(directory: str, what: str) -> None:
    """ConfigError unless `directory` is (or can be made) a writable directory."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what}: cannot create {directory!r} ({e.strerror}); pass a writable path") from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(f"{what}: {directory!r} is not writable; pass a writable path")


def nothing_fits(tried: list[Row]) -> str:
    """Why a search found no setting, and what to change."""
    if tried and all("does not split" in (r.skipped or "") for r in tried):
        return (f"{tried[0].skipped} (nor over any other mesh of this slice): choose a slice whose chip count "
                "divides the batch, or change RecipeConfig.batch_seqs")
    return "no setting tried fits with 10% headroom: try a larger slice (or a shorter RecipeConfig.seq_len)"


def calibrated_line(cal: dict, steps: int) -> str:
    """The calibrated expectation (`aot.calibration.expected`) as one report line, with its band and basis."""
    days = steps * cal["step_seconds"] / 86400
    return (f"expected  {cal['step_seconds']:.3f} s/step ({cal['step_seconds_lo']:.3f}–{cal['step_seconds_hi']:.3f}), "
            f"MFU {cal['mfu']:.0%} ({cal['mfu_lo']:.0%}–{cal['mfu_hi']:.0%}), {days:.2f} days: {cal['basis']} "
            "(docs/accelerators.md)")


def format_report(report: dict) -> str:
    """A compile report (`aot.compile.compile_report`, or the JSON of a search's best row) as aligned lines."""
    if "mesh_shape" not in report:
        return f"nothing fits: {report['error']}"
    if report.get("by_model"):
        return _uncompiled(report)
    lines = [f"setting   {setting_line(report)}"]
    gb = report["bytes_per_chip"] / 1e9 if report["bytes_per_chip"] else float("nan")
    verdict = (f"fits, {report['headroom']:.0%} headroom" if report["fits"] else
               f"DOES NOT FIT ({report['error'] or 'over the chip memory'})")
    lines.append(f"memory    {gb:.1f} GB per chip of {report['usable_bytes_per_chip'] / 1e9:.1f} GB usable: {verdict}")
    lines.append(f"compile   {report['compile_seconds']:.1f} s")
    if report.get("est_step_seconds"):
        lines.append(f"estimate* {report['est_step_seconds']:.3f} s/step, {report['est_tokens_per_sec']:,.0f} tokens/s, "
                     f"MFU {report['est_mfu']:.1%}; the plan's {report['steps']:,} steps: {report['est_days']:.2f} days, "
                     f"{report['est_chip_hours']:,.0f} chip-hours")
        lines.append(f"          XLA FLOPs / model FLOPs = {report['xla_flops_per_step'] / report['model_flops_per_step']:.2f}")
    if report.get("calibrated"):
        lines.append(calibrated_line(report["calibrated"], report["steps"]))
    lines.append(f"*         {report['estimate_note']}")
    if report["fits"]:
        lines.append(_gin_line(report["gin_params"]))
    else:
        data_shards = report["mesh_shape"][0] * report["mesh_shape"][1]
        lines.append("fix       " + fix_hint(report["microbatches"], report["batch_seqs"], data_shards, report["remat"]))
    return "\n".join(lines)


def _uncompiled(report: dict) -> str:
    """A search's best so far that only the footprint model has sized: the search stopped before compiling it."""
    setting = StepSetting.of_report(report)
    lines = [f"setting   mesh (data, fsdp, tensor) {setting.mesh_shape}, {setting.microbatches} microbatches, "
             f"remat {setting.remat}, scan_layers {setting.scan_layers}",
             f"memory    {report['model_bytes'] / 1e9:.1f} GB per chip by the footprint model; the search stopped "
             "before XLA compiled this step: run `celerity compile` with the gin line below to check it"]
    if report.get("est_step_seconds"):
        lines.append(f"estimate* {report['est_step_seconds']:.3f} s/step, MFU {report['est_mfu']:.1%}")
        lines.append(f"*         {report['estimate_note']}")
    lines.append(_gin_line(setting.gin_params()))
    return "\n".join(lines)


def _gin_line(gin_params: list[str]) -> str:
    return "gin       " + " ".join(f'--gin-param "{p}"' for p in gin_params)
