"""The CompleteP forward multipliers folded into the parameters (export) and taken out again (import).

Our forward multiplies the embedding output by α_input, each residual branch by m_L^−α, the logits by α_output/m_d
and the scores by the attention scale; a stock decoder multiplies by nothing but 1/sqrt(head_dim). Each multiplier
c goes into the parameters that feed it linearly, as each parameter declares (`params.Declaration.fold`):

| leaf                                   | c                                  |
|----------------------------------------|------------------------------------|
| embed, pos_embed (added before α_input) | α_input                            |
| attn q kernel and bias                 | attention scale · sqrt(head_dim)   |
| attn o, mlp down: kernels and biases   | m_L^−α                             |
| unembed (embed.T when tied)            | α_output / m_d                     |
RoPE rotates q linearly, so the q factor commutes with it.

A fold is computed in float64 and rounded once: y = fl32(x·c). The unfold divides (in float64) and then searches
the neighbouring float32 values for one whose fold gives y back, so x comes back bit for bit wherever the fold is
injective (c a power of two, or x's mantissa in the part of its binade that c does not push into the next one).
Elsewhere two float32 values can fold to the same y; the unfold then picks the candidate nearest y/c, which is
off by one ulp for about half of those values, and no reader of y alone can do better. The export therefore also
records, per such leaf, one bit per value saying which of the two it was (`lost_bits`); with them the unfold of
unchanged weights is exact.
"""

import dataclasses
import functools
import hashlib
import math

import numpy as np

from celerity_jax.errors import ConfigError
from celerity_jax.model import completep, transformer
from celerity_jax.model.completep import Role
from celerity_jax.model.config import ModelConfig
from celerity_jax.model.params import Declaration

LOST_BITS = "celerity_unfold.npz"  # the export's file of lost bits (`save_lost_bits`)
# Neighbours of fl32(y/c) that the unfold tries, in ulps, nearest first.
_SEARCH_ULPS = (0, 1, -1, 2, -2)


def constants(cfg: ModelConfig) -> dict[str, float]:
    """The float64 factor folded into each kind of leaf: input, query, residual, output."""
    mult = completep.forward_multipliers(cfg)
    return {"input": mult["input"], "query": mult["attention"] * math.sqrt(cfg.head_dim),
            "residual": mult["residual"], "output": mult["output"]}


def _unscanned(cfg: ModelConfig) -> dict[str, Declaration]:
    return flat_tree(transformer.declarations(dataclasses.replace(cfg, scan_layers=False)))


@functools.cache
def declarations(cfg: ModelConfig) -> dict[str, Declaration]:
    """{flat path: Declaration} of the unscanned parameters of `cfg`, and of the `unembed` that a tied model's
    export adds (the embedding's transpose, which feeds the logits): declared as the untied model declares it."""
    flat = _unscanned(cfg)
    if cfg.tie_embeddings:
        path = tied_unembed(cfg)
        flat[path] = _unscanned(dataclasses.replace(cfg, tie_embeddings=False))[path]
    return flat


@functools.cache
def token_embedding(cfg: ModelConfig) -> str:
    """The flat path of the token embedding: the one parameter with a vocab × embed layout."""
    return next(p for p, d in _unscanned(cfg).items() if d.axes == ("vocab", "embed"))


@functools.cache
def tied_unembed(cfg: ModelConfig) -> str:
    """The flat path under which a tied model's export holds the unembedding (the untied model's own path)."""
    untied = dataclasses.replace(cfg, tie_embeddings=False)
    return next(p for p, d in _unscanned(untied).items() if d.role is Role.UNEMBEDDING)


def leaf_factor(cfg: ModelConfig, path: str) -> float:
    """The factor folded into the leaf at `path` ("block_0/attn/q/kernel", ...), as its declaration says."""
    fold_name = declarations(cfg)[path].fold
    return 1.0 if fold_name is None else constants(cfg)[fold_name]


def flat_tree(tree: dict, prefix: str = "") -> dict:
    """{"block_0/attn/q/kernel": leaf, ...} of a nested dict."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat_tree(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def flatten(params: dict) -> dict[str, np.ndarray]:
    """{"block_0/attn/q/kernel": float32 array, ...} of an (unscanned) parameter tree."""
    return {path: np.asarray(value, np.float32) for path, value in flat_tree(params).items()}


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def fold_array(x: np.ndarray, c: float) -> np.ndarray:
    """fl32(x·c), the product taken in float64."""
    return x if c == 1.0 else (x.astype(np.float64) * c).astype(np.float32)


def fold(cfg: ModelConfig, params: dict) -> dict[str, np.ndarray]:
    """Flat float32 leaves with every multiplier folded in, and always an `unembed` (the embedding, when tied)."""
    flat = flatten(params)
    if cfg.tie_embeddings:
        flat[tied_unembed(cfg)] = flat[token_embedding(cfg)].T
    return {path: fold_array(x, leaf_factor(cfg, path)) for path, x in flat.items()}


def unfold_array(stored: list[tuple[np.ndarray, float]], second: np.ndarray | None = None) -> np.ndarray:
    """The float32 x whose folds x·c give every (y, c) in `stored` (several for a tied embedding); where none does
    (a bfloat16 export, or weights changed after the export), fl32(y/c) of the first. Where two candidates fold
    right, the nearest is taken, or the other where the bool mask `second` (the export's lost bits) says so."""
    y0, c0 = stored[0]
    y0 = y0.astype(np.float32)
    if all(c == 1.0 for _, c in stored):
        return y0
    x0 = (y0.astype(np.float64) / c0).astype(np.float32)
    chosen, found = x0.copy(), np.zeros(x0.shape, bool)
    skip = np.zeros(x0.shape, bool) if second is None else second.copy()
    for ulps in _SEARCH_ULPS:
        candidate = _step_ulps(x0, ulps)
        fits = ~found
        for y, c in stored:
            fits &= fold_array(candidate, c) == y.astype(np.float32)
        take = fits & ~skip
        skip &= ~fits
        chosen[take] = candidate[take]
        found |= take
    return chosen


def _stored(cfg: ModelConfig, folded: dict[str, np.ndarray], path: str) -> list[tuple[np.ndarray, float]]:
    """The folded values a leaf of the parameters is recovered from: its own, and lm_head's for a tied embedding."""
    stored = [(folded[path], leaf_factor(cfg, path))]
    if cfg.tie_embeddings and path == token_embedding(cfg) and tied_unembed(cfg) in folded:
        stored.append((folded[tied_unembed(cfg)].T, leaf_factor(cfg, tied_unembed(cfg))))
    return stored


def unfold(cfg: ModelConfig, folded: dict[str, np.ndarray],
           lost: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The flat parameters of `cfg` from folded leaves (an `unembed` among them is optional when tied); `lost` maps
    a path to its `second` mask (see `lost_bits`)."""
    return {path: unfold_array(_stored(cfg, folded, path), (lost or {}).get(path))
            for path in folded if not (cfg.tie_embeddings and path == tied_unembed(cfg))}


def lost_bits(cfg: ModelConfig, params: dict, folded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{path: bool mask} of the leaves whose unfold takes the wrong one of two candidates somewhere: the one bit per
    such value that the fold rounds away. With them the unfold gives back every float32 value."""
    flat = flatten(params)
    masks = {}
    for path, x in flat.items():
        stored = _stored(cfg, folded, path)
        wrong = unfold_array(stored) != x
        if wrong.any():
            masks[path] = wrong
    return masks


def _digest(cfg: ModelConfig, folded: dict[str, np.ndarray], path: str) -> str:
    digest = hashlib.sha256()
    for y, _ in _stored(cfg, folded, path):
        digest.update(np.ascontiguousarray(y, np.float32).tobytes())
    return digest.hexdigest()


def save_lost_bits(file: str, cfg: ModelConfig, masks: dict[str, np.ndarray], folded: dict[str, np.ndarray]) -> None:
    """The masks, packed 8 to a byte, each with the SHA-256 of the folded values it belongs to."""
    arrays = {}
    for i, (path, mask) in enumerate(masks.items()):
        arrays[f"bits_{i}"] = np.packbits(mask.ravel())
        arrays[f"meta_{i}"] = np.array([path, _digest(cfg, folded, path)])
    np.savez_compressed(file, **arrays)


def load_lost_bits(file: str, cfg: ModelConfig, folded: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list]:
    """(the masks whose folded values are unchanged, the paths of those that changed since the export)."""
    masks, stale = {}, []
    try:
        with np.load(file, allow_pickle=False) as saved:
            for i in range(sum(name.startswith("bits_") for name in saved.files)):
                path, digest = (str(v) for v in saved[f"meta_{i}"])
                if path not in folded or _digest(cfg, folded, path) != digest:
                    stale.append(path)
                    continue
                n = folded[path].size
                masks[path] = np.unpackbits(saved[f"bits_{i}"])[:n].astype(bool).reshape(folded[path].shape)
    except Exception as e:  # zipfile, zlib and numpy each raise their own error types for a damaged file
        raise ConfigError(f"{file} is damaged ({type(e).__name__}: {e}); copy it again from the export, or delete "
                          "it to import from the weights alone (some values then one ulp off)") from None
    return masks, stale


def _step_ulps(x: np.ndarray, ulps: int) -> np.ndarray:
    toward = np.float32(np.inf if ulps > 0 else -np.inf)
    for _ in range(abs(ulps)):
        x = np.nextafter(x, toward)
    return x
