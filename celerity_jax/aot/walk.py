"""The walk over one mesh's settings in `celerity compile --search` (`aot/search.py`): for each remat, from the
largest microbatch the footprint model (`aot/footprint.py`) says may fit, the model decides a size where it is
sure and the step is compiled where it is not; a size that fits is followed by the next size up, one that does
not by the next size down, and the largest that fits is settled, to be estimated."""

import collections
import dataclasses
import itertools

from celerity_jax import accelerators
from celerity_jax.aot import footprint
from celerity_jax.aot.compile import StepSetting, Target, apply_setting, slice_devices
from celerity_jax.aot.row import MIN_HEADROOM, Row, Verdict, usable
from celerity_jax.model import sharding
from celerity_jax.model.config import REMATS

# The footprint model has been within these factors of XLA's bytes on the Celerity configs
# (docs/results/compile.md): a size it puts under limit / SURE_FITS fits, one over SLACK × limit does not; a size
# in between is compiled. A setting the model alone says fits is compiled when it leads, before it is chosen.
SURE_FITS = 1.6
SLACK = 1.2


def microbatch_seqs(per_shard: int) -> list[int]:
    """Sequences per data shard in one microbatch: powers of two that divide the shard's batch, then all of it."""
    sizes = [s for s in (2**i for i in range(12)) if s < per_shard and per_shard % s == 0]
    return sizes + [per_shard]


class MeshWalk:
    """The walk over one mesh's (remat, microbatch size) settings. A size is decided by the footprint model,
    scaled by XLA's bytes over its own at the mesh's last compile, where the model is sure (fits even when
    SURE_FITS × more; does not fit even at SLACK × less); otherwise its step is compiled. Too many bytes would
    drop a setting unseen, so the model errs low where it must guess (tensor meshes), and a setting it alone
    says fits is compiled when it leads."""

    def __init__(self, configs, topology: str, mesh_shape, plan, *, remats=REMATS, floor=-1, tops=None,
                 ratio=1.0):
        """The keywords walk part of a mesh again (`below`): its remats, the size index the first of them must
        pass, the size index each must stay under, and the model's scale."""
        slice_, devices = slice_devices(topology)
        self.configs, self.topology, self.mesh_shape, self.plan = configs, topology, tuple(mesh_shape), plan
        self.platform = slice_.chip.platform
        self.limit = (1 - MIN_HEADROOM) * accelerators.usable_bytes(slice_.chip)  # as `usable` judges a compile
        self.mesh = sharding.make_mesh(self.mesh_shape, devices=devices)
        self.per_shard = plan.batch_seqs // sharding.data_shards(self.mesh)
        self.sizes = microbatch_seqs(self.per_shard)
        self.tops = tops or {}
        self.state = footprint.state_bytes(
            Target.of(configs, topology, StepSetting(self.mesh_shape, 2, "none", True)).build())
        self.remats = collections.deque(remats)
        self.floor = floor  # index of the largest size that fits with less remat
        self.floors: dict[str, int] = {}  # remat -> the floor it walked above
        self.fits_at: dict[str, int] = {}  # remat -> the index it settled at
        self.ratio = ratio  # XLA's bytes over the model's, at the mesh's last compile
        self.fit: dict[int, Row] = {}  # index -> the row of a size that fits, this remat
        self.decided: set[int] = set()
        self.rows: list[Row] = []  # decided by the model or a step compile, to be logged
        self.settled: list[Row] = []  # the largest fitting size of each remat, to be estimated
        self.compile_index = self._walk(self._first_index())

    def setting(self, index: int) -> StepSetting:
        return StepSetting(self.mesh_shape, self.per_shard // self.sizes[index], self.remats[0], True)

    def model_bytes(self, index: int) -> float:
        run = apply_setting(self.configs, self.setting(index), self.platform)
        return footprint.footprint(run.model, self.mesh, microbatches=self.per_shard // self.sizes[index],
                                   micro_seqs=self.plan.batch_seqs * self.sizes[index] // self.per_shard,
                                   seq_len=self.plan.seq_len, state=self.state).total

    def _verdict(self, index: int) -> Verdict:
        scaled = self.model_bytes(index) * self.ratio
        if scaled * SURE_FITS <= self.limit:
            return Verdict.FITS
        return Verdict.TOO_BIG if scaled > SLACK * self.limit else Verdict.UNSURE

    def _first_index(self) -> int | None:
        above = range(self.floor + 1, self._top())
        maybe = [i for i in above if self._verdict(i) != Verdict.TOO_BIG]
        return maybe[-1] if maybe else (above[0] if above else None)

    def _walk(self, index: int | None) -> int | None:
        """Decides sizes by the model from `index` on, remat by remat; the next size to compile, or None when the
        mesh is done."""
        while self.remats:
            if index is None:
                self._settle()
                index = self._first_index() if self.remats else None
                continue
            verdict = self._verdict(index)
            if verdict == Verdict.UNSURE:
                return index
            self.decided.add(index)
            row = Row(self.setting(index), model_bytes=self.model_bytes(index), by_model=verdict)
            self.rows.append(row)
            index = self._next(index, verdict == Verdict.FITS, row)
        return None

    def _next(self, index: int, fits: bool, row: Row) -> int | None:
        if fits:
            self.fit[index] = row
            up = index + 1
            return up if up < self._top() and up not in self.decided else None
        down = index - 1
        return down if down > self.floor and down not in self.decided and down not in self.fit else None

    def _top(self) -> int:
        return self.tops.get(self.remats[0], len(self.sizes))

    def _settle(self):
        self.floors[self.remats[0]] = self.floor
        if self.fit:
            self.floor = self.fits_at[self.remats[0]] = max(self.fit)
            self.settled.append(self.fit[self.floor])
        self.remats.popleft()
        self.fit, self.decided = {}, set()

    def below(self, row: Row) -> "MeshWalk":
        """The walk again under a setting this walk settled by the model that XLA's compile says does not fit,
        with the model scaled by XLA's bytes there: its remat under its size, then each more remat that settled
        nothing here up to its size (above it, this walk has decided them)."""
        remat, index = row.setting.remat, self.sizes.index(self.per_shard // row.setting.microbatches)
        more = itertools.takewhile(lambda r: r not in self.fits_at, REMATS[REMATS.index(remat) + 1:])
        tops = {remat: index, **{r: index + 1 for r in more}}
        return MeshWalk(self.configs, self.topology, self.mesh_shape, self.plan, remats=tuple(tops),
                         floor=self.floors[remat], tops=tops, ratio=row.bytes_per_chip / row.model_bytes)

    def record(self, index: int, row: Row):
        """Takes the row of the step compile at `index`, with the model's bytes added, and walks on."""
        self.decided.add(index)
        row = dataclasses.replace(row, model_bytes=self.model_bytes(index))
        if row.bytes_per_chip:
            self.ratio = row.bytes_per_chip / row.model_bytes
        self.rows.append(row)
        self.compile_index = self._walk(self._next(index, usable(row), row))
