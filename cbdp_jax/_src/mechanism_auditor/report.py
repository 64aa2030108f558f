"""The written record of an audit: ``audit.json`` and a one-page ``report.png``."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from cbdp_jax._src.infra.io import atomic_savefig, atomic_write_json
from cbdp_jax._src.mechanism_auditor.claims import parse_claim
from cbdp_jax._src.mechanism_auditor.results import AuditResult


def _short(x, limit: int = 60) -> str:
    text = str(np.round(np.asarray(x, np.float64), 3).tolist())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plot_report(result: AuditResult, path: Path, pair_text: str | None = None) -> None:
    """One page: the certified bound per class over the grid beside the claimed curve, and the pair.

    Each class's curve is the larger of its two directions' certified bounds at each grid point.
    The title is wrapped (never cut at the page's edges); ``pair_text`` says what D and D' are where
    their values mean nothing to a reader (a training audit's ``[1.0]`` and ``[0.0]``).
    """
    import matplotlib

    from cbdp_jax._src.infra.display import wrap

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, text_ax) = plt.subplots(
        2, 1, figsize=(8.0, 6.2), gridspec_kw={"height_ratios": [3, 0.9]}
    )
    grid = sorted({r.grid for r in result.rows})
    is_eps = result.grid_name == "epsilon"
    if is_eps and len(grid) > 1:  # the claimed delta(eps') curve, drawn between the grid points too
        claim = parse_claim(result.claim)
        fine = np.linspace(grid[0], grid[-1], 200)
        ax.plot(fine, [claim.claimed_delta(e) for e in fine], "k--", lw=2, label="claimed")
    else:
        claimed = [max(r.claimed for r in result.rows if r.grid == g) for g in grid]
        ax.plot(grid, claimed, "k--", lw=2, label="claimed")
    for critic in dict.fromkeys(r.critic for r in result.rows):
        ys = []
        for g in grid:
            vals = [r.lower_bound for r in result.rows if r.critic == critic and r.grid == g]
            ys.append(max(vals) if vals else math.nan)
        ax.plot(grid, ys, "o-", label=f"certified: {critic}")
    ax.set_xlabel("epsilon" if is_eps else "alpha")
    ax.set_ylabel("delta(epsilon) = E_{e^eps} lower bound" if is_eps else "divergence lower bound")
    title = wrap(f"cbdp audit: {result.mechanism}  claim {result.claim}", 80, indent="", hard=True)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    text_ax.axis("off")
    lines = [
        ("VIOLATION" if result.violation else "no violation found")
        + f" (family-wise {100 * result.confidence:g}%, K = {result.family_size})",
        *textwrap.wrap(result.verdict, 100),
        *(
            [pair_text]
            if pair_text
            else [f"D  = {_short(result.pair[0])}", f"D' = {_short(result.pair[1])}"]
        ),  # fmt: skip
        f"{result.samples} samples per side (fresh), {len(result.screened)} pairs screened, "
        f"{result.seconds:.1f} s",
    ]
    text_ax.text(0.0, 1.0, "\n".join(lines), va="top", family="monospace", fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)  # whole or absent, even when the run is interrupted
    plt.close(fig)


def write_report(result: AuditResult, out: Path, extra: dict | None = None) -> dict:
    """Writes ``out/audit.json`` (the result, and ``extra``'s fields) and ``out/report.png``.

    Returns:
      The JSON record written.

    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = result.to_dict() | (extra or {})
    atomic_write_json(out / "audit.json", record)
    pair_text = ((extra or {}).get("training") or {}).get("pair")
    plot_report(result, out / "report.png", pair_text=pair_text)
    return record
