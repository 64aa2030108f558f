"""Black-box audits of DP-SGD on the digits: worst-case against average-case initial parameters.

The adversary sees only the final model's loss on the canary. DP-SGD (the library's step, the sum of
clipped gradients, not averaged: lr 5e-4 on the sum, which is lr 0.5 on the mean of 1,000 examples)
trains logistic regression (or --model mlp / cnn) on the bundled digits, full batch (every example
in every step) for T steps, or Poisson-sampled at rate q. The noise is calibrated so that the
accountant (dp_accounting's PLD, add/remove) gives the theoretical eps at delta = 1e-5 for that T
and q. Each row is one audit (``audit_training``: thresholds and histograms of the score, exact
binomial tail sets, 95%) of ``--runs`` trainings per side:

* ``empirical_mu``: the largest GDP mu the certified rows refute;
* ``empirical_epsilon``: the largest eps at delta they refute (rigorous: no assumption on the
  mechanism);
* ``empirical_epsilon_gdp``: eps at delta of ``empirical_mu``-GDP, the convention of Nasr et al. 2023
  and Annamalai & De Cristofaro 2024. It ASSUMES the trade-off curve is Gaussian, which holds for
  full-batch DP-SGD (exactly mu-GDP with mu = sqrt(T) / S) and not for Poisson sampling.

Cases (``--cases``): ``worst-case:crafted`` (cbdp_jax._src.training_auditor.crafted_init: fitted, rescaled to
saturation, the canary on the unused pixels, labelled least likely), ``average-case:crafted`` (the
default initialisation, the same canary rule) and ``average-case:default`` (the default
initialisation and the library's default input canary: every pixel at its maximum, the rarest
class; what ``cbdp audit-training --threat black-box`` audits today).

``--repeats K`` adds K more audits of every row at ``--repeat-runs`` per side with other keys: the
count of those flagged as violations (every configuration here is correct, so any flag is a false
accusation). Each finished row is written at once (``--out``, a list of rows, merged by row key with
what the file holds), so a run cut short keeps its rows.

    python benchmarks/black_box.py --device cpu --runs 10000 --epsilons 10 \\
        --out benchmarks/measured/black-box/summary.json
    # GPU (H200), full digits, 10^5 runs per side, about 5 minutes:
    python benchmarks/black_box.py --device gpu --examples 1797 --runs 100000 --chunk 16384 \\
        --epsilons 10 --samplings full --cases worst-case:crafted,average-case:default \\
        --budget 280 --out $OUT/black-box-gpu.json
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

DELTA = 1e-5
CASES = ("worst-case:crafted", "average-case:crafted", "average-case:default")


def gdp_epsilon(mu: float, delta: float) -> float:
    """eps at ``delta`` of mu-GDP (Dong, Roth, Su 2022, Cor. 2.13), by bisection (0 if mu <= 0)."""
    from cbdp_jax.audit import gdp_delta

    if not mu > 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gdp_delta(mu, mid) > delta else (lo, mid)
    return hi


def _problem(case: str, args, eps: float, rate: float):
    from cbdp_jax import training_audit as ta
    from cbdp_jax.training_audit import crafted_problem, dpsgd_noise

    init, canary = case.split(":")
    noise = dpsgd_noise(eps, DELTA, rate, args.steps)
    problem, report = crafted_problem(
        model=args.model, n=args.examples, init=init, noise=noise, rate=rate, steps=args.steps,
        learning_rate=args.lr, chunk=args.chunk, seed=args.seed,
    )  # fmt: skip
    if canary == "default":
        x, y = problem.data
        problem = dataclasses.replace(problem, canary=ta.input_canary(np.asarray(x), np.asarray(y)))
    return problem, report, noise


def _audit(problem, eps: float, runs: int, seed: int) -> tuple[object, float]:
    from cbdp_jax import training_audit as ta

    config = ta.training_audit_config(eps, samples=runs)
    last = [time.perf_counter()]

    def progress(p):
        if time.perf_counter() - last[0] > 30 or p.done == p.total:
            last[0] = time.perf_counter()
            print(f"    {p.done}/{p.total} runs, {p.seconds:.0f} s, eta {p.eta:.0f} s", flush=True)

    t0 = time.perf_counter()
    result = ta.audit_training(jax.random.key(seed), problem, config=config, progress=progress)
    return result, time.perf_counter() - t0


def row(case: str, args, eps: float, sampling: str) -> dict:
    rate = 1.0 if sampling == "full" else float(sampling.split(":")[1])
    problem, report, noise = _problem(case, args, eps, rate)
    print(f"{case} eps {eps} {sampling}: S = {noise:.4f}; {report}", flush=True)
    result, seconds = _audit(problem, eps, args.runs, args.seed)
    emp = result.empirical
    claimed = result.claimed["epsilon"]
    out = {
        "init": case.split(":")[0], "canary": case.split(":")[1], "model": args.model,
        "data": "digits", "examples": int(args.examples), "steps": args.steps, "rate": rate,
        "noise": noise, "learning_rate": args.lr, "delta": DELTA,
        "theoretical_epsilon": claimed,
        "theoretical_mu": math.sqrt(args.steps) / noise if rate == 1.0 else None,
        "empirical_mu": emp.gdp_mu, "empirical_epsilon": emp.epsilon,
        "empirical_epsilon_gdp": gdp_epsilon(emp.gdp_mu, DELTA),
        "empirical_epsilon_gdp_assumes": "a Gaussian trade-off curve (exact for full batch only)",
        "runs_per_side": args.runs, "seconds": seconds,
        "trainings_per_second": 2 * args.runs / seconds, "violation": bool(result.violation),
        "start": report.to_dict(), "seed": args.seed, "device": jax.default_backend(),
    }  # fmt: skip
    out["gdp_ratio"] = out["empirical_epsilon_gdp"] / claimed
    out["repeats"] = _repeats(problem, eps, args) if args.repeats else None
    return out


def _repeats(problem, eps: float, args) -> dict:
    flagged, mus = 0, []
    for k in range(args.repeats):
        result, _ = _audit(problem, eps, args.repeat_runs, 1000 + k)
        flagged += bool(result.violation)
        mus.append(result.empirical.gdp_mu)
    return {"audits": args.repeats, "runs_per_side": args.repeat_runs, "flagged": flagged,
            "mu_mean": float(np.mean(mus)), "mu_min": float(np.min(mus))}  # fmt: skip


def _key(r: dict) -> tuple:
    return (r["init"], r["canary"], r["model"], r["examples"], r["steps"], r["rate"],
            round(r["theoretical_epsilon"], 3))  # fmt: skip


def _merge(path: Path, new: dict) -> list[dict]:
    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if _key(r) != _key(new)] + [new]
    rows.sort(key=lambda r: (r["rate"] != 1.0, r["theoretical_epsilon"], r["init"], r["canary"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    os.replace(tmp, path)
    return rows


def markdown(rows: list[dict]) -> str:
    """The README's table of the rows (``--markdown``)."""
    head = (
        "| model (examples) | init | canary | T | q | theoretical eps | claim's mu | certified mu |"
        " rigorous eps | GDP-convention eps (ratio) | runs per side | seconds | flagged |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        rep = r.get("repeats")
        flagged = "no" if not r["violation"] else "**yes**"
        if rep:
            flagged += f"; {rep['flagged']} of {rep['audits']} at {rep['runs_per_side']}"
        mu = "-" if r["theoretical_mu"] is None else f"{r['theoretical_mu']:.3f}"
        lines.append(
            f"| {r['model']} ({r['examples']}) | {r['init']} | {r['canary']} | {r['steps']} | "
            f"{r['rate']:g} | {r['theoretical_epsilon']:.3g} | {mu} | {r['empirical_mu']:.3f} | "
            f"{r['empirical_epsilon']:.3f} | {r['empirical_epsilon_gdp']:.3f} ({r['gdp_ratio']:.3f}) | "
            f"{r['runs_per_side']} | {r['seconds']:.0f} | {flagged} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], "benchmarks/measured/black-box/summary.json")
    p.add_argument("--examples", type=int, default=1000, help="digits examples (1797: all)")
    p.add_argument("--model", default="logreg", choices=("logreg", "mlp", "cnn"))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=5e-4, help="learning rate on the SUM of gradients")
    p.add_argument("--epsilons", default="1,2,4,10")
    p.add_argument("--samplings", default="full,poisson:0.1", help="full and/or poisson:RATE")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--runs", type=int, default=10_000, help="trainings per side")
    p.add_argument("--chunk", type=int, default=2048, help="most runs per device per call")
    p.add_argument("--repeats", type=int, default=0)
    p.add_argument("--repeat-runs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=math.inf, help="seconds; no new row after it")
    p.add_argument(
        "--markdown", action="store_true", help="print --out's rows as a table, run nothing"
    )
    args = p.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.out).read_text())))
        return
    _common.setup_device(args.device)
    # Full float32 matrix products: a GPU's default TF32 rounds the canary's logits (hundreds) by
    # about 1e-2, a fifth of the final loss's noise here (0.06); the privacy is the same, the
    # audit's view of it is not. No effect on a CPU.
    jax.config.update("jax_default_matmul_precision", "highest")
    if args.quick:
        args.runs, args.examples = min(args.runs, 1000), min(args.examples, 300)
    t0, out = time.perf_counter(), Path(args.out)
    load = os.getloadavg()
    for sampling in args.samplings.split(","):
        for eps in (float(e) for e in args.epsilons.split(",")):
            for case in args.cases.split(","):
                if time.perf_counter() - t0 > args.budget:
                    print(
                        f"budget of {args.budget:.0f} s spent: {case} eps {eps} {sampling} not run"
                    )
                    continue
                r = row(case, args, eps, sampling)
                r["load_before"] = list(load)
                r["load_after"] = list(os.getloadavg())
                rows = _merge(out, r)
                cols = ("init", "canary", "steps", "rate", "theoretical_epsilon", "theoretical_mu",
                        "empirical_mu", "empirical_epsilon", "empirical_epsilon_gdp", "gdp_ratio",
                        "runs_per_side", "seconds", "violation")  # fmt: skip
                _common.print_table("black-box audits (delta 1e-5, 95%)",
                                    [{c: x.get(c) for c in cols} for x in rows], cols)  # fmt: skip
    print(f"total {time.perf_counter() - t0:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
