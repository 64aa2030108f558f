"""The critics of a training run's release: what an audit checks beyond the accountant's own score.

A training audit's sample of one run is a row ``[score, release...]``: the threat's score (the
accountant's likelihood ratio ``'llr'`` under the gradient threat) and the run's release flattened
(:mod:`~cbdp_jax._src.training_auditor.release`, ``[rows, k]`` row-major). :func:`release_groups` names the
feature groups the audit certifies in ONE Bonferroni family
(:class:`~cbdp_jax._src.mechanism_auditor.hockey_stick.FeatureGroup`, docs/theory/training_audit.md, section 10).
Under the gradient threat, with z the canary coordinate's updates ``[T]``, dz its step-to-step
differences and r = z - (the dead twins' mean) its twin-differenced series:

* ``'score'``: the threat's score, every critic class at every grid point (the audit of before);
* ``'sum'``: sum_t z_t (when the score is not already the sum);
* ``'steps'``: max_t |dz_t| and sum_t dz_t^2 (noise repeated or correlated across steps);
* ``'twins'``: max_t |r_t|, sum_t r_t^2 and sum_t r_t (noise shared across coordinates);
* ``'exact'``: how many of z, dz and r are not exactly 0 (noise missing at some steps, repeated, or
  shared exactly: a statistic that is constant under D' and moves under D);
* ``'learned'``: an MLP 32x2 logit of [z, dz, r, and per coordinate the sum, the sum of squares and
  the largest step-to-step change of all k coordinates, the three counts], fitted on the training
  split, then thresholded: the capacity-bounded adversary, a function class trained on samples.

Each group but the score is certified at the grid's lowest point and at the claimed eps (a half-space
of its features) and by the two tail critics (the set refuting the largest eps at the claim's
delta), so that a critic exactly constant under D' certifies a large eps through exact binomial
bounds. The white-box threat's groups are the score, the k final coordinates (``'coordinates'``),
the canary's coordinates minus the twins (``'twins'``) and a learned critic of all of them.
"""

from __future__ import annotations

import numpy as np

from cbdp_jax._src.mechanism_auditor.hockey_stick import FeatureGroup
from cbdp_jax._src.training_auditor.release import ReleaseLayout

_FEW = ("halfspace",)  # the critic class of a release group at its two grid points


def _score(x: np.ndarray) -> np.ndarray:
    # float64, as the audit of the score alone has it: the score group's rows are that audit's
    return np.asarray(np.asarray(x)[:, :1], np.float64)


def _series(x: np.ndarray, layout: ReleaseLayout) -> np.ndarray:
    """The release ``[n, rows, k]`` of sample rows ``[n, 1 + rows k]``."""
    x = np.asarray(x)
    return x[:, 1:].reshape(x.shape[0], layout.steps, layout.width)


def _parts(x: np.ndarray, layout: ReleaseLayout) -> dict[str, np.ndarray]:
    """Z ``[n, T]``, dz ``[n, T-1]``, r ``[n, T]`` (None without twins) and the release itself."""
    s = _series(x, layout)
    z = s[:, :, 0]
    twins = list(layout.columns("twin"))
    r = z - s[:, :, twins].mean(axis=2) if twins else None
    return {"release": s, "z": z, "dz": np.diff(z, axis=1), "r": r}


def _stats(v: np.ndarray, *, signed: bool = False) -> list[np.ndarray]:
    """Max |v_t| and sum v_t^2 (and sum v_t) of series ``[n, m]`` (zeros for an empty series)."""
    if v.shape[1] == 0:
        return [np.zeros(v.shape[0])] * (3 if signed else 2)
    out = [np.max(np.abs(v), axis=1), np.sum(np.square(v, dtype=np.float64), axis=1)]
    return out + ([np.sum(v, axis=1, dtype=np.float64)] if signed else [])


def _counts(p: dict) -> np.ndarray:
    """How many entries of z, dz (and r) are not exactly 0, ``[n, 2 or 3]``."""
    parts = [p["z"], p["dz"]] + ([p["r"]] if p["r"] is not None else [])
    return np.stack([np.count_nonzero(v, axis=1) for v in parts], axis=1).astype(np.float64)


def _learned_input(x: np.ndarray, layout: ReleaseLayout) -> np.ndarray:
    """What the learned critic sees of a gradient release (see the module's docstring)."""
    p = _parts(x, layout)
    s = p["release"].astype(np.float64)
    per = [s.sum(1), np.square(s).sum(1), np.abs(np.diff(s, axis=1)).max(1, initial=0.0)]
    series = [p["z"], p["dz"]] + ([p["r"]] if p["r"] is not None else [])
    return np.concatenate([*series, *per, _counts(p)], axis=1)


def _gradient_groups(layout: ReleaseLayout, score_kind: str | None) -> list[FeatureGroup]:
    few = dict(classes=_FEW, grid=False)
    groups = [FeatureGroup("score", _score)]
    if score_kind != "sum":
        groups.append(FeatureGroup("sum", lambda x: _parts(x, layout)["z"].sum(1)[:, None], **few))
    if layout.steps > 1:
        groups.append(
            FeatureGroup("steps", lambda x: np.stack(_stats(_parts(x, layout)["dz"]), 1), **few)
        )
    if layout.columns("twin"):
        twins = lambda x: np.stack(_stats(_parts(x, layout)["r"], signed=True), 1)
        groups.append(FeatureGroup("twins", twins, **few))
    groups.append(FeatureGroup("exact", lambda x: _counts(_parts(x, layout)), **few))
    learned = lambda x: _learned_input(x, layout)
    return groups + [FeatureGroup("learned", learned, learned=True, **few)]


def _final_groups(layout: ReleaseLayout) -> list[FeatureGroup]:
    few = dict(classes=_FEW, grid=False)
    coords = lambda x: _series(x, layout)[:, 0, :].astype(np.float64)
    groups = [FeatureGroup("score", _score), FeatureGroup("coordinates", coords, **few)]
    canary, twins = list(layout.columns("canary")), list(layout.columns("twin"))

    def minus_twins(x):
        c = coords(x)
        return c[:, canary] - c[:, twins].mean(1, keepdims=True)

    if twins:
        groups.append(FeatureGroup("twins", minus_twins, **few))

    def everything(x):
        parts = [_score(x).astype(np.float64), coords(x)] + ([minus_twins(x)] if twins else [])
        return np.concatenate(parts, axis=1)

    return groups + [FeatureGroup("learned", everything, learned=True, **few)]


def release_groups(layout: ReleaseLayout, score_kind: str | None = None) -> tuple:
    """The feature groups of a training audit's samples ``[n, 1 + rows k]`` (none for black-box).

    Args:
      layout: What each run records (:func:`~cbdp_jax._src.training_auditor.release.release_layout`).
      score_kind: The gradient threat's score (``'llr'``, ``'sum'``, ``'custom'``); with ``'sum'``
        the ``'sum'`` group would repeat the score and is left out.

    Returns:
      A tuple of :class:`~cbdp_jax._src.mechanism_auditor.hockey_stick.FeatureGroup`, the score's first; empty when
      the threat releases nothing beyond the score.

    """
    if layout.kind == "updates":
        return tuple(_gradient_groups(layout, score_kind))
    if layout.kind == "final":
        return tuple(_final_groups(layout))
    return ()


GROUPS = ("score", "sum", "steps", "twins", "exact", "learned", "coordinates")
