"""The public inputs checked and parsed: divergence, adversary (class or feature map), tolerance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from cbdp_jax._src.exact.pairs import NoisePair
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    _fail,
    check_choice,
    check_in_range,
    check_int_at_least,
)
from cbdp_jax._src.privacy.divergences import DIVERGENCE_NAMES, Divergence

ADVERSARIES = ("linear", "poly")


class _Adversary(NamedTuple):
    kind: str  # 'linear' | 'poly' | 'feature_map'
    degree: int | None
    fn: Callable | None


def _parse_divergence(divergence: Any, alpha: Any, convention: str) -> tuple[str, str]:
    if isinstance(divergence, Divergence):
        name = divergence.name
        convention = divergence.convention
    else:
        name = check_choice("divergence", divergence, DIVERGENCE_NAMES)
    check_choice("convention", convention, ("abs", "nonneg"))
    if name not in ("renyi", "alpha") and alpha is not None:
        _fail(
            "alpha",
            alpha,
            "must be None for divergence " + repr(name),
            "only 'renyi' and 'alpha' use it",
        )
    return name, convention


def _parse_adversary(adversary: Any, degree: Any) -> _Adversary:
    if callable(adversary) and not isinstance(adversary, str):
        return _Adversary("feature_map", None, adversary)
    check_choice(
        "adversary", adversary, ADVERSARIES + ("<a callable feature map x [n] -> [n, m]>",)
    )
    k = check_int_at_least("degree", degree, 1)
    if adversary == "linear" and k != 1:
        _fail("degree", degree, "must be 1 for adversary 'linear'", "use adversary='poly'")
    return _Adversary(adversary, k, None)


def _call_features(fn: Callable, x: np.ndarray) -> np.ndarray:
    try:
        arr = np.asarray(fn(x), dtype=np.float64)
    except Exception as exc:  # noqa: BLE001 - any failure of user code is a bad input
        raise InvalidParameterError(
            f"adversary={fn!r} is invalid: calling it on an array of shape {x.shape} failed: {exc}"
        ) from exc
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] != x.shape[0] or arr.shape[1] < 1:
        _fail(
            "adversary",
            fn,
            f"must map x [n] to features [n, m]; got shape {arr.shape} for n={x.shape[0]}",
        )
    return arr


def _check_feature_map(fn: Callable, scale: float) -> int:
    probe = _call_features(fn, np.linspace(-2.0, 2.0, 7) * max(scale, 1.0))
    if not np.all(np.isfinite(probe)):
        _fail("adversary", fn, "the feature map must return finite values")
    return probe.shape[1]


def _check_tol(tol: Any) -> float:
    return check_in_range("tol", tol, 0.0, 1e-3, low_open=True)


def _n_params(pair: NoisePair, adv: _Adversary) -> int:
    if adv.kind == "linear":
        return pair.dim
    if adv.kind == "poly":
        return adv.degree
    return _check_feature_map(adv.fn, pair.scale or 1.0)
