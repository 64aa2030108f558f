"""``cbdp demo``: the README's main job.

For Laplace (eps = 1) and Gaussian (sigma = 1), estimates (H, KL) and (H, Renyi alpha = 4) for H = linear,
poly_3 and an MLP from held-out samples, beside the exact restricted value (quadrature + concave solver,
for the classes linear in their parameters) and the analytic unrestricted value (the ceiling).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

CASES = (
    ("laplace", "kl", None),
    ("laplace", "renyi", 4.0),
    ("gaussian", "kl", None),
    ("gaussian", "renyi", 4.0),
)
CLASSES = (("linear", {}), ("poly", {"degree": 3}), ("mlp", {"width": 32, "depth": 2}))


def _references(mech: str, div: str, alpha: float | None, adversary: str, options: dict) -> dict:
    from cbdp_jax._src import exact
    from cbdp_jax._src.estimator import analytic

    if mech == "laplace":
        pair = exact.laplace_pair(1.0)
        unrestricted = (
            analytic.laplace_kl(1.0) if div == "kl" else analytic.laplace_renyi(alpha, 1.0)
        )
    else:
        pair = exact.gaussian_pair(1.0)
        unrestricted = (
            analytic.gaussian_kl(1.0) if div == "kl" else analytic.gaussian_renyi(alpha, 1.0)
        )
    restricted = None
    if adversary in ("linear", "poly"):
        res = exact.restricted_divergence(
            pair, div, adversary, degree=options.get("degree", 1), alpha=alpha
        )
        restricted = float(res.value)
    return {"exact_restricted": restricted, "unrestricted": float(unrestricted)}


def run_demo(
    *, samples: int = 100_000, steps: int = 1000, seed: int = 0, out: Path | None = None
) -> list[dict[str, Any]]:
    """Runs the demo table and prints it; optionally writes ``demo.json`` into ``out``.

    On a terminal, standard error shows the count of estimates done and an ETA while it runs.
    """
    import jax

    from cbdp_jax._src.infra.io import atomic_write_json, environment_info
    from cbdp_jax._src.infra.progress import Progress

    rows: list[dict[str, Any]] = []
    keys = jax.random.split(jax.random.key(seed), len(CASES) * len(CLASSES))
    t0 = time.perf_counter()
    with Progress("cbdp demo", total=len(keys), unit="estimates") as bar:
        for i, ((mech, div, alpha), (adversary, options)) in enumerate(
            (case, cls) for case in CASES for cls in CLASSES
        ):
            rows.append(_row(keys[i], mech, div, alpha, adversary, options, samples, steps))
            bar.advance()
    print(render_table(rows, samples, time.perf_counter() - t0, environment_info()["device"]))
    if out is not None:
        atomic_write_json(
            Path(out) / "demo.json", {"rows": rows, "environment": environment_info()}
        )
    return rows


def _row(key, mech, div, alpha, adversary, options, samples: int, steps: int) -> dict[str, Any]:
    """One estimate of the demo, with its exact and unrestricted references."""
    from cbdp_jax._src.estimator.estimate import EstimatorConfig, estimate
    from cbdp_jax._src.mechanisms import make_mechanism

    mechanism = (
        make_mechanism("laplace", epsilon=1.0)
        if mech == "laplace"
        else make_mechanism("gaussian", sigma=1.0)
    )
    config = EstimatorConfig(steps=steps, ensemble=4, batch_size=2048, learning_rate=1e-2)
    res = estimate(
        key, mechanism, samples=samples, adversary=adversary, divergence=div, alpha=alpha,
        config=config, **options,
    )  # fmt: skip
    return {
        "mechanism": "Laplace eps=1" if mech == "laplace" else "Gauss sigma=1",
        "divergence": res.divergence,
        "adversary": res.adversary,
        "estimate": res.estimate,
        "lower_bound": res.lower_bound,
        "std_error": res.std_error,
        "bound_reliable": res.bound_reliable,
        "bound_on_named_class": res.bound_on_named_class,
        "certified_class": res.certified_class,
        "certified_estimate": res.certified_estimate,
        **_references(mech, div, alpha, adversary, options),
        "warnings": list(res.warnings),
    }


_COLUMNS = ("class", "estimate", "± SE", "95% lower bound", "exact (H)", "unrestricted")


def render_table(
    rows: list[dict[str, Any]], samples: int, seconds: float, device: str, width: int | None = None
) -> str:
    """The demo's tables (one per mechanism and divergence) and legend, at most ``width`` columns.

    ``width`` defaults to the terminal's (``$COLUMNS``, 80 when unset and piped). A bound on the
    bounded class ``B tanh(H / B)`` is shown in a row of that class, under its own name and beside
    its own held-out estimate (the named class's estimate and exact value may be smaller than a
    bound on another class); a bound on a shrunk critic far from the row's estimate is marked with a
    letter and explained below the table.
    """
    import textwrap

    from rich.console import Console

    console = Console(width=width, record=True, file=_Null(), color_system=None)
    width = console.width
    notes: list[str] = []
    console.print(
        textwrap.fill(
            f"Capacity-bounded privacy: held-out estimates ({samples} train / {samples} test "
            "samples per side) beside exact and analytic values",
            width,
        )
    )
    for case in dict.fromkeys((r["mechanism"], r["divergence"]) for r in rows):
        console.print(
            _case_table(case, [r for r in rows if (r["mechanism"], r["divergence"]) == case], notes)
        )
    for note in notes:
        console.print(textwrap.fill(note, width, subsequent_indent="   "))
    console.print(textwrap.fill(_LEGEND + f" {seconds:.0f} s on {device}.", width))
    return "\n".join(line.rstrip() for line in console.export_text().rstrip("\n").splitlines())


_LEGEND = (
    "exact (H): the true restricted value for classes linear in their parameters (quadrature + "
    "concave solver); unrestricted: the analytic KL / Renyi-DP. Estimates are held-out, so they sit "
    "at or below the exact value up to noise; the one-sided 95% bound lies below the true value in "
    "95% of runs, so about one row in twenty may sit above it by chance. '(refused)': the "
    "asymptotic bound's assumption failed on the held-out data (a tail too heavy to trust the "
    "CLT), so the bound is the trivial 0. '└ B=b': the class of the row above bounded by b, "
    "b tanh(H / b), with its own held-out estimate; where a class's bound falls back to it, the "
    "bound is on that row (below its estimate and the unrestricted value, not on exact (H))."
)


def _case_table(case: tuple[str, str], rows: list[dict[str, Any]], notes: list[str]):
    from rich.table import Table

    table = Table(title=f"{case[0]}, {case[1]}", title_justify="left")
    for col in _COLUMNS:
        # never narrower than the header's longest word: rich would break it mid-word
        table.add_column(
            col,
            justify="left" if col == "class" else "right",
            min_width=max(len(w) for w in col.split()),
            overflow="fold",
        )
    for r in rows:
        bound = _f(r["lower_bound"]) + ("" if r["bound_reliable"] else " (refused)")
        if _on_another_class(r):  # the bound gets the row of the class it is on, under its own name
            table.add_row(r["adversary"], _f(r["estimate"]), _f(r["std_error"]), "-",
                          _f(r["exact_restricted"]), _f(r["unrestricted"]))  # fmt: skip
            table.add_row(_bounded_label(r["certified_class"]), _f(r["certified_estimate"]), "-",
                          bound, "-", _f(r["unrestricted"]))  # fmt: skip
            continue
        note = _bound_note(r)
        if note is not None:
            mark = chr(ord("a") + len(notes))
            bound += f" ({mark})"
            notes.append(f"({mark}) {case[0]}, {case[1]}, {r['adversary']}: {note}")
        table.add_row(
            r["adversary"],
            _f(r["estimate"]),
            _f(r["std_error"]),
            bound,
            _f(r["exact_restricted"]),
            _f(r["unrestricted"]),
        )
    return table


def _on_another_class(r: dict[str, Any]) -> bool:
    """Whether the row's bound is on the bounded class B tanh(H / B) (guarantee 'auto' fell back).

    Such a row is shown as two: the named class with its estimate and exact value and no bound, then
    the bounded class under its own name with its own held-out estimate and the bound, which sits
    under that estimate and under the unrestricted value, not under the named class's exact value.
    """
    own = r.get("certified_estimate")
    return (not r["bound_on_named_class"] and own is not None and math.isfinite(own)
            and bool(r.get("certified_class")))  # fmt: skip


def _bounded_label(name: str) -> str:
    """``'3.837*tanh(mlp(32x2)/3.837)'`` as ``'└ B=3.84'``: the class above it, bounded by B."""
    import re

    m = re.match(r"^\s*([0-9.eE+-]+)\s*\*\s*tanh\(", name)
    if not m:
        return f"└ {name}"
    b = float(m.group(1))
    return f"└ B={b:.0f}" if b >= 100 else f"└ B={b:.3g}"  # 1190, not 1.19e+03


def _bound_note(r: dict[str, Any]) -> str | None:
    """Why a row's bound is not a bound under its estimate, with the estimate it is under; else None.

    The bound is on a shrunk critic whose held-out estimate lies more than two standard errors from
    the row's (a bound on another class gets a row of its own instead, :func:`_on_another_class`).
    """
    own = r.get("certified_estimate")
    if own is None or not math.isfinite(own):
        return None
    if abs(own - r["estimate"]) > 2 * r["std_error"]:
        return (
            f"the bound {_f(r['lower_bound'])} is on the critic as shrunk for its guarantee (its "
            f"tails), whose own held-out estimate is {_f(own)}, not {_f(r['estimate'])}."
        )
    return None


def _f(x) -> str:
    return "-" if x is None else ("+inf" if math.isinf(x) else f"{x:.4f}")


class _Null:
    """A file that discards what is written (the console records it instead)."""

    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass
