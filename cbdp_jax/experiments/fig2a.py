"""Paper Figure 2a (appendix): exact (lin, Renyi) of the Gaussian mechanism, its bounds and Renyi-DP.

Panel (a) is the paper's setting, sigma = 1, where the printed Table 1 bound crosses Renyi-DP near
alpha = 2.3 (docs/theory/mechanisms.md: the corrected bound near 2.53); panel (b), sigma = 2, shows the printed bound
falling below the exact (lin, Renyi) value (docs/theory/mechanisms.md: alpha = 4 and 7).
"""

from __future__ import annotations

from pathlib import Path

from cbdp_jax.experiments._renyi_curves import Setting, lin_figure


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs Figure 2a; writes fig2a.png / .csv / .json and returns the summary with its checks."""
    return lin_figure(
        "fig2a",
        Setting("gaussian", 1.0),
        Setting("gaussian", 2.0),
        paper_crossing=2.3,
        math_crossing=2.53,
        out_dir=out_dir,
        quick=quick,
    )
