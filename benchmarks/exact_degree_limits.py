"""How far in the polynomial degree the exact layer certifies its values: the measurement behind
``cbdp_jax.exact.DEGREE_LIMITS`` (docs/theory/exact_solver.md, section 5).

For each noise pair (Laplace eps, Gaussian sigma; unit sensitivity) and divergence (KL, Renyi at
several orders, chi^2) it walks degrees 1..D with ``exact.restricted_divergence_degrees`` (each degree
warm started from the previous and checked against it), with the limits lifted for the measurement,
and records per degree: the value, whether it was certified (``converged``: Newton decrement, the
monotonicity check and the quadrature checks), the decrement, and the time. A setting's "certified up
to" is the largest degree L such that every degree 1..L was certified.

Usage: python benchmarks/exact_degree_limits.py [--quick] [--out FILE]
(--quick: Laplace eps in {0.5, 1, 2}, Gaussian sigma in {0.5, 1, 2}, four subsampled Gaussian settings
(q, sigma, direction), KL and Renyi 2 / 4 only.)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

from cbdp_jax import exact  # noqa: E402
from cbdp_jax._src.exact import limits as _limits  # noqa: E402

PROBE = {"kl": 16, "alpha": 48, "chi2": 48}  # the degrees probed (limits lifted to these)
PROBE_SUBSAMPLED = {"kl": 12, "alpha": 24, "chi2": 24}


def _settings(quick: bool) -> list[tuple[str, Any, str, float | None]]:
    lap = (0.5, 1.0, 2.0) if quick else (0.1, 0.5, 1.0, 2.0, 5.0)
    gau = (0.5, 1.0, 2.0) if quick else (0.3, 0.5, 1.0, 2.0, 5.0)
    sub = (
        ((0.1, 1.0, "remove"), (0.01, 0.5, "remove"), (0.1, 1.0, "add"), (0.5, 2.0, "add"))
        if quick
        else tuple(
            (q, s, d) for q in (0.01, 0.1, 0.5) for s in (0.5, 1.0, 2.0) for d in ("remove", "add")
        )
    )
    divs: list[tuple[str, float | None]] = [("kl", None), ("renyi", 2.0), ("renyi", 4.0)]
    if not quick:
        divs += [("renyi", 1.5), ("renyi", 8.0), ("chi2", None)]
    out = []
    for family, params in (("laplace", lap), ("gaussian", gau), ("subsampled_gaussian", sub)):
        for p in params:
            for div, alpha in divs:
                out.append((family, p, div, alpha))
    return out


def _walk(family: str, param: Any, div: str, alpha: float | None) -> dict[str, Any]:
    if family == "laplace":
        pair = exact.laplace_pair(param)
    elif family == "gaussian":
        pair = exact.gaussian_pair(param)
    else:
        q, sigma, direction = param
        pair = exact.subsampled_gaussian_pair(sigma, q, direction=direction)
    probe = PROBE_SUBSAMPLED if family == "subsampled_gaussian" else PROBE
    top = probe[_limits._divergence_group(div)]
    t0 = time.perf_counter()
    results = exact.restricted_divergence_degrees(pair, div, top, alpha=alpha)
    seconds = time.perf_counter() - t0
    rows = [
        {
            "degree": r.degree,
            "value": r.value,
            "converged": r.converged,
            "newton_decrement": r.newton_decrement,
            "monotone_checked": r.monotone_checked,
            "reason": r.reason,
        }
        for r in results
    ]
    certified = 0
    for r in results:
        if not r.converged:
            break
        certified = r.degree
    return {
        "family": family,
        "param": param,
        "divergence": div,
        "alpha": alpha,
        "probed_to": top,
        "certified_to": certified,
        "seconds": seconds,
        "degrees": rows,
    }


def main() -> None:
    args = _common.parser(__doc__.splitlines()[0], "results/exact_degree_limits.json").parse_args()
    _common.setup_device(args.device)
    saved = {f: dict(v) for f, v in _limits.DEGREE_LIMITS.items()}
    for fam in _limits.DEGREE_LIMITS:  # lift the limits for the measurement only
        for group, top in PROBE.items():
            _limits.DEGREE_LIMITS[fam][group] = top
    walks = []
    try:
        for family, param, div, alpha in _settings(args.quick):
            w = _walk(family, param, div, alpha)
            walks.append(w)
            print(
                f"{family:8s} {param!s:18s} {div:5s} alpha={alpha!s:5s} certified to "
                f"{w['certified_to']:2d} of {w['probed_to']} ({w['seconds']:.0f} s)",
                flush=True,
            )
    finally:
        _limits.DEGREE_LIMITS.clear()
        _limits.DEGREE_LIMITS.update(saved)
    _common.write(args.out, "exact_degree_limits", args, {"probe": PROBE, "walks": walks})


if __name__ == "__main__":
    main()
