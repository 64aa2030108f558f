"""Paper Figure 2b (appendix): exact (poly_k, Renyi), k = 1, 2, 3, of the Gaussian mechanism (sigma = 1).

Rising with k toward Renyi-DP holds at every order. "Eventually decreasing in alpha" holds for all three
classes here, with peaks near alpha = 1.75 (lin), 4 (poly_2) and 20 (poly_3) (docs/theory/mechanisms.md).
"""

from __future__ import annotations

from pathlib import Path

from cbdp_jax.experiments._renyi_curves import Setting, poly_figure


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs Figure 2b; writes fig2b.png / .csv / .json and returns the summary with its checks."""
    return poly_figure(
        "fig2b",
        Setting("gaussian", 1.0),
        expected_peaks={1: 1.75, 2: 4.0, 3: 20.0},
        out_dir=out_dir,
        quick=quick,
    )
