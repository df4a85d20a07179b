"""The rows of `celerity compile --search` (`aot/search.py`): one per setting tried, decided by the footprint model,
by XLA's compile of its step, or skipped; and their JSON, as `--search --json` and tpu_plans.json hold them."""

import dataclasses
import enum

from celerity_jax.aot.compile import StepSetting

MIN_HEADROOM = 0.10


class Verdict(enum.Enum):
    """The footprint model's verdict on a setting's memory."""
    FITS = "fits"
    TOO_BIG = "no"
    UNSURE = "compile"  # XLA's compile of the step decides


# The keys every row's JSON holds, in this order where the row did not start from a compile report.
ROW_KEYS = ("mesh_shape", "microbatches", "remat", "scan_layers", "fits", "bytes_per_chip", "model_bytes",
            "headroom", "est_step_seconds", "est_mfu")


@dataclasses.dataclass(frozen=True)
class Row:
    """A setting tried: fits, bytes per chip and headroom are XLA's where it compiled the step, and stay unknown
    (fits False) where the footprint model decided (`by_model`); skipped says why a setting was not compiled
    or why its compile failed (then `error` holds the failure)."""
    setting: StepSetting
    fits: bool | None = False
    bytes_per_chip: float | None = None
    model_bytes: float | None = None  # the footprint model's bytes per chip
    headroom: float | None = None
    est_step_seconds: float | None = None
    est_mfu: float | None = None
    by_model: Verdict | None = None  # FITS or TOO_BIG where the model decided and XLA has not compiled the step
    skipped: str | None = None
    error: str | None = None
    report: dict | None = None  # the latest compile report (`aot.compile.compile_report`) of the setting
    # made from its step's compile report (not by the model or a skip): its JSON keys are in the report's order
    from_step_compile: bool = False

    @classmethod
    def of_step_compile(cls, report: dict) -> "Row":
        return cls(StepSetting.of_report(report), report=report, from_step_compile=True,
                   **_compiled_fields(report))

    def updated(self, result: "dict | Row") -> "Row":
        """The row with a later compile's result: its report, or the row of its failure. Where the model decided,
        its verdict on the memory stands."""
        if isinstance(result, Row):
            fields = {f: getattr(result, f) for f in ("fits", "bytes_per_chip", "model_bytes", "headroom",
                                                       "est_step_seconds", "est_mfu", "skipped", "error")}
        else:
            fields = dict(_compiled_fields(result), report=result)
        if self.by_model is not None:
            for memory in ("fits", "bytes_per_chip", "headroom"):
                fields.pop(memory)
        return dataclasses.replace(self, **fields)

    def to_json(self) -> dict:
        own = {"mesh_shape": list(self.setting.mesh_shape), "microbatches": self.setting.microbatches,
               "remat": self.setting.remat, "scan_layers": self.setting.scan_layers, "fits": self.fits,
               "bytes_per_chip": self.bytes_per_chip, "model_bytes": self.model_bytes, "headroom": self.headroom,
               "est_step_seconds": self.est_step_seconds, "est_mfu": self.est_mfu, "error": self.error}
        report = {k: own.get(k, v) for k, v in (self.report or {}).items()}
        if self.from_step_compile:
            out = dict(report, model_bytes=self.model_bytes)
        else:
            out = {k: own[k] for k in ROW_KEYS}
            if self.by_model is not None:
                out["by_model"] = self.by_model.value
            out.update(report)
        if self.skipped is not None:
            out["skipped"] = self.skipped
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, row: dict) -> "Row":
        from_step_compile = next(iter(row)) != ROW_KEYS[0]  # a compile report starts with the slice
        kept = ("model_bytes", "skipped") if from_step_compile else ROW_KEYS + ("by_model", "skipped")
        report = {k: v for k, v in row.items() if k not in kept}
        return cls(StepSetting.of_report(row), fits=row["fits"], bytes_per_chip=row["bytes_per_chip"],
                   model_bytes=row.get("model_bytes"), headroom=row["headroom"],
                   est_step_seconds=row["est_step_seconds"], est_mfu=row["est_mfu"],
                   by_model=Verdict(row["by_model"]) if "by_model" in row else None, skipped=row.get("skipped"),
                   error=row.get("error"), report=report if set(report) - {"error"} else None,
                   from_step_compile=from_step_compile)


def _compiled_fields(report: dict) -> dict:
    return {k: report[k] for k in ("fits", "bytes_per_chip", "headroom", "est_step_seconds", "est_mfu", "error")}


def usable(row: Row) -> bool:
    """Whether XLA's compile says the setting fits with MIN_HEADROOM to spare."""
    return bool(row.fits) and (row.headroom or 0) >= MIN_HEADROOM
