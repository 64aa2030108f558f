"""Paper Figure 1a: exact (lin, Renyi) of the Laplace mechanism, its upper bounds and Renyi-DP.

Panel (a) is the paper's setting, eps = 1: the exact (lin, Renyi) parameter (quadrature + Newton,
:mod:`cbdp_jax.exact`), the Table 1 upper bound as printed and as corrected in docs/theory/mechanisms.md, the
exact Renyi-DP parameter (eq. 4) and its lower bound. The paper reports the printed bound crossing
Renyi-DP near alpha = 3.3; docs/theory/mechanisms.md puts the corrected bound's crossing near 5.19. Panel (b), eps = 0.5,
shows the printed bound falling below the exact value (docs/theory/mechanisms.md: alpha = 4 and 7).
"""

from __future__ import annotations

from pathlib import Path

from cbdp_jax.experiments._renyi_curves import Setting, lin_figure


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs Figure 1a; writes fig1a.png / .csv / .json and returns the summary with its checks."""
    return lin_figure(
        "fig1a",
        Setting("laplace", 1.0),
        Setting("laplace", 0.5),
        paper_crossing=3.3,
        math_crossing=5.19,
        out_dir=out_dir,
        quick=quick,
    )
