"""Input maps fitted on training samples: the fixed function a critic sees its inputs through.

An estimate trains h on T(x), where T is fitted on the pooled TRAINING samples of both sides and then
applied unchanged to the validation and test samples. ``'standard'`` is the identity (the adversary's own
mean / standard-deviation standardisation then applies, an affine map under which every built-in class is
closed). Two outlier-robust maps, for outputs whose spread is set by a few huge values (point masses
beside heavy tails, e.g. a mean released with a noise scale that divides by a noisy count):

- ``'robust'``: z = asinh((x - median) / s) coordinatewise, s the interquartile range / 1.349 (the
  median absolute deviation x 1.4826, or the mean absolute deviation, when it is 0). Linear near the
  bulk, logarithmic in the tails.
- ``'rank'``: the mid-rank empirical CDF of the pooled training samples, coordinatewise, in [0, 1]:
  u = (#{train < x} + #{train <= x}) / (2 n). An atom holding a share w of the training samples becomes
  one level, w wide away from its neighbours, whatever the size of the outliers. Where the training
  samples have atoms (levels holding at least :data:`MIN_ATOM_SHARE` of them), the map also gives, per
  coordinate, the indicators 1{x = a_k} of its :data:`ATOM_FEATURES` heaviest atoms (unused slots are
  0): a critic then isolates an atom with one weight, where on u alone it must grow a narrow spike
  between two gaps, which a short training often leaves low and wide.

Once fitted, T is a fixed measurable function, so h o T is one fixed critic and every held-out bound of
docs/theory/bounds.md holds for it as it does for h: it bounds D^{H o T} and the unrestricted
divergence (docs/theory/bounds.md, "Input maps"). ``'auto'`` first screens the pooled training samples
(:func:`screen`): when the standard deviation is within :data:`SPREAD_RATIO` of the robust scale in every
coordinate that is not a few-level one, the data are ordinary and only ``'standard'`` is used (the estimate is then exactly the one
``'standard'`` gives); otherwise all three maps train for one validation block, the one with the best
VALIDATION objective is trained in full and evaluated (``estimator._select``).

References:
  Huber, Ronchetti, "Robust Statistics", 2nd ed., Wiley 2009, sections 5.1 and 5.3 (the median,
  interquartile range and median absolute deviation as location and scale estimates).
  van der Vaart, "Asymptotic Statistics", Cambridge 1998, section 19.1 (the empirical distribution
  function).

"""

from __future__ import annotations

import dataclasses

import numpy as np

INPUT_MAPS = ("standard", "robust", "rank")
INPUT_MAP_CHOICES = (*INPUT_MAPS, "auto")
# 'auto' tries the robust maps when the standard deviation exceeds this multiple of the robust scale
# in some coordinate (about 1 for a Gaussian, 1.4 for a Laplace law, 2 for a log-normal(0, 1)).
SPREAD_RATIO = 5.0
# ... counted only in coordinates where at least this share of the pooled training values are distinct.
MIN_DISTINCT_SHARE = 0.01
# The rank map counts values closer than this many robust-scale units as tied: an atom blurred by
# rounding-level noise (a scale clamped at 1e-12) is one level, not a spread of ranks.
TIE_RESOLUTION = 1e-6
# The rank map's atom indicators: this many per coordinate (a fixed number, so that the mapped
# dimension, and with it the compiled training program, does not depend on how many atoms the data
# have), for levels holding at least this share of the pooled training samples.
ATOM_FEATURES = 4
MIN_ATOM_SHARE = 0.005
_IQR_TO_SIGMA = 1.349  # the interquartile range of N(0, 1)
_MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class InputMap:
    """A coordinatewise map fitted on training samples; applied identically to every later sample.

    Attributes:
      kind: ``'standard'`` (identity), ``'robust'`` or ``'rank'``.
      centre: ``'robust'``: the per-coordinate median ``[d]``.
      spread: ``'robust'``: the per-coordinate robust scale ``[d]`` (positive).
      levels: ``'rank'``: per coordinate, the distinct pooled training values on the tie grid, sorted.
      below: ``'rank'``: per coordinate, how many pooled training values lie below each level, then
        their total (one more entry than ``levels``).
      atoms: ``'rank'``: per coordinate, the :data:`ATOM_FEATURES` levels whose indicators follow the
        ranks (heaviest first, NaN for an unused slot, whose indicator is 0); empty when the training
        samples have no atom in any coordinate (the map is then the ranks alone).

    """

    kind: str
    centre: np.ndarray | None = None
    spread: np.ndarray | None = None
    levels: tuple[np.ndarray, ...] = ()
    below: tuple[np.ndarray, ...] = ()
    atoms: tuple[np.ndarray, ...] = ()

    @property
    def label(self) -> str:
        """How the map reads in a class label (``'(ecdf(x), 1{x=atom})'`` for ranks with indicators)."""
        if self.kind == "rank" and self.atoms:
            return "(ecdf(x), 1{x=atom})"
        return {"standard": "x", "robust": "asinh((x-med)/s)", "rank": "ecdf(x)"}[self.kind]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The map applied to ``x`` ``[n, d]`` (float64 out; the identity returns ``x`` itself).

        ``'rank'`` with atoms gives ``[n, d (1 + ATOM_FEATURES)]``: the d ranks, then each coordinate's
        atom indicators.
        """
        if self.kind == "standard":
            return x
        x = np.asarray(x, np.float64)
        if self.kind == "robust":
            return np.arcsinh((x - self.centre) / self.spread)
        g = self.grid(x)
        cols = [
            _mid_ranks(levels, below, g[:, j]) / (2.0 * below[-1])
            for j, (levels, below) in enumerate(zip(self.levels, self.below, strict=True))
        ]
        cols += [
            (g[:, j] == a).astype(np.float64) for j, atoms in enumerate(self.atoms) for a in atoms
        ]
        return np.stack(cols, axis=1)

    def grid(self, x: np.ndarray) -> np.ndarray:
        """``'rank'``: x on a grid of :data:`TIE_RESOLUTION` robust-scale units (closer values tie)."""
        return np.round((np.asarray(x, np.float64) - self.centre) / (TIE_RESOLUTION * self.spread))


IDENTITY = InputMap(kind="standard")


def _heaviest_atoms(levels: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """The :data:`ATOM_FEATURES` heaviest levels holding >= :data:`MIN_ATOM_SHARE` of n, NaN-padded."""
    order = np.argsort(-counts, kind="stable")[:ATOM_FEATURES]
    heavy = levels[order][counts[order] >= MIN_ATOM_SHARE * n]
    return np.concatenate([heavy, np.full(ATOM_FEATURES - heavy.size, np.nan)])


def _mid_ranks(levels: np.ndarray, below: np.ndarray, g: np.ndarray) -> np.ndarray:
    """#{train < g} + #{train <= g} for each value of ``g``, by one search among the distinct levels."""
    i = np.searchsorted(levels, g, "left")
    at = np.minimum(i, levels.size - 1)
    tied = (i < levels.size) & (levels[at] == g)
    return below[i] + np.where(tied, below[at + 1], below[i])


def robust_scale(x: np.ndarray) -> np.ndarray:
    """Per-coordinate robust scale of ``x`` ``[n, d]``: IQR / 1.349, else MAD x 1.4826, else mean |x - med|.

    A coordinate where all three are 0 (every sample equal) gets 1.
    """
    x = np.asarray(x, np.float64)
    med = np.median(x, axis=0)
    q25, q75 = np.percentile(x, [25.0, 75.0], axis=0)
    dev = np.abs(x - med)
    iqr = (q75 - q25) / _IQR_TO_SIGMA
    mad = np.median(dev, axis=0) * _MAD_TO_SIGMA
    mean_dev = np.mean(dev, axis=0)
    return np.where(iqr > 0, iqr, np.where(mad > 0, mad, np.where(mean_dev > 0, mean_dev, 1.0)))


def fit(kind: str, train_p: np.ndarray, train_q: np.ndarray) -> InputMap:
    """The map ``kind`` fitted on the pooled training samples of both sides (``[n, d]`` and ``[m, d]``).

    Pooling makes the map the same for D(P, Q) and D(Q, P), and symmetric in the two laws.
    """
    if kind == "standard":
        return IDENTITY
    pooled = np.concatenate([np.asarray(train_p, np.float64), np.asarray(train_q, np.float64)])
    if kind == "robust":
        return InputMap(
            kind="robust", centre=np.median(pooled, axis=0), spread=robust_scale(pooled)
        )
    if kind == "rank":
        base = InputMap(kind="rank", centre=np.median(pooled, axis=0), spread=robust_scale(pooled))
        g = base.grid(pooled)
        counted = [np.unique(g[:, j], return_counts=True) for j in range(g.shape[1])]
        atoms = tuple(_heaviest_atoms(levels, counts, len(pooled)) for levels, counts in counted)
        return dataclasses.replace(
            base,
            levels=tuple(levels for levels, _ in counted),
            below=tuple(np.concatenate([[0], np.cumsum(counts)]) for _, counts in counted),
            atoms=atoms if any(np.isfinite(a).any() for a in atoms) else (),
        )
    raise ValueError(f"kind={kind!r} is invalid: must be one of {INPUT_MAPS}")


def screen(train_p: np.ndarray, train_q: np.ndarray) -> tuple[bool, float]:
    """Are the pooled training samples outlier-heavy? ``(heavy, largest std / robust-scale ratio)``.

    Heavy when, in some coordinate with at least :data:`MIN_DISTINCT_SHARE` of its values distinct, the
    standard deviation exceeds :data:`SPREAD_RATIO` times the robust scale: the adversary's mean /
    standard-deviation standardisation would then be set by the outliers and squeeze the bulk (and any
    atoms in it) together. A coordinate with few levels (bits, counts, an argmax) is left out: its
    levels stay apart whatever its spread (a rare 1 among 0s has a ratio near 10, no squeeze).
    """
    pooled = np.concatenate([np.asarray(train_p, np.float64), np.asarray(train_q, np.float64)])
    with np.errstate(all="ignore"):
        ratios = np.std(pooled, axis=0) / robust_scale(pooled)
    many = [
        np.unique(pooled[:, j]).size >= MIN_DISTINCT_SHARE * len(pooled) for j in range(len(ratios))
    ]
    ratios = np.where(np.asarray(many, bool) & ~np.isnan(ratios), ratios, 0.0)
    ratio = float(np.max(ratios)) if ratios.size else 0.0
    return ratio > SPREAD_RATIO, ratio


def candidates(
    input_map: str, train_p: np.ndarray, train_q: np.ndarray, *, class_bound: bool = False
) -> tuple[list[str], str]:
    """The maps to train for the option ``input_map``, and why (recorded as ``input_map_choice``).

    ``class_bound``: the bound must be on the class itself (``guarantee='class'``), so ``'auto'``
    keeps the identity.
    """
    if input_map != "auto":
        return [input_map], "asked for"
    if class_bound:
        return ["standard"], "auto: a bound on the class itself needs the standard map"
    heavy, ratio = screen(train_p, train_q)
    if not heavy:
        return ["standard"], (
            f"auto: the training samples' standard deviation is {ratio:.3g} x their robust scale "
            f"(at most {SPREAD_RATIO:g}), so the standard map is used"
        )
    return list(INPUT_MAPS), (
        f"auto: the training samples' standard deviation is {ratio:.3g} x their robust scale (above "
        f"{SPREAD_RATIO:g}): standard, robust and rank maps screened on validation samples"
    )
