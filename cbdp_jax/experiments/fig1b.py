"""Paper Figure 1b: exact (poly_k, Renyi), k = 1, 2, 3, of the Laplace mechanism (eps = 1).

The paper says the values rise with k toward Renyi-DP and "eventually decrease" in alpha. The first holds
at every order; the second is measured here on an extended grid up to alpha = 50: it holds for the
linear class (peak near alpha = 2.75) but the poly_2 and poly_3 curves are still rising at alpha = 50
(docs/theory/mechanisms.md).
"""

from __future__ import annotations

from pathlib import Path

from cbdp_jax.experiments._renyi_curves import Setting, poly_figure


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs Figure 1b; writes fig1b.png / .csv / .json and returns the summary with its checks."""
    return poly_figure(
        "fig1b",
        Setting("laplace", 1.0),
        expected_peaks={1: 2.75, 2: None, 3: None},
        out_dir=out_dir,
        quick=quick,
    )
