"""One-run training audits on real DP-SGD runs (issue 50): soundness, bugs, tightness, black-box, scale.

Each section trains the digits MLP (hidden 400: 3 blank pixels x 400 = 1,200 coordinates no
example moves, so m = 1,000 gradient canaries are coordinate canaries; 30,010 parameters) and writes
benchmarks/measured/one-run-training/<section>.json:

* ``soundness``: 50 one-run audits of a correct training (50 keys, vmapped): per method, the count
  of eps above the accountant's; and a negative control, the post-hoc method that takes the top half
  of the scores as "included", on the same scores.
* ``bugs``: no-clip and noise-after-averaging, one run each at m = 1,000, accountant's eps near 2,
  canaries of norm 100 C (the auditor's choice: a correct step clips them to C).
* ``tightness``: q = 0.01, T = 1,000, eps near 2, 4, 8, m = 1,000, R runs each (median); the
  finite-sample ceiling for N(mu, 1) scores at the gaussian-scores' fitted mu; a full-batch row
  (q = 1, T = 10, eps near 8).
* ``black-box``: input canaries (out-of-distribution) at eps near 8, m = 1,000, default start.
* ``scale``: one run at m = 1,000 and 10,000 (dense directions) in a subprocess each: seconds and
  peak resident memory.

  python benchmarks/one_run_training.py SECTION [--runs R]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from scipy import optimize

from cbdp_jax import training_audit as ta
from cbdp_jax._src.infra.io import git_commit
from cbdp_jax.audit import gdp_delta
from cbdp_jax.training_audit import dpsgd_noise

OUT = Path(__file__).parent / "measured" / "one-run-training"
HIDDEN = 400
METHODS = ("steinke", "fdp", "gdp", "gaussian-scores")


def problem(*, eps: float, rate: float, steps: int, bug: str = "none", norm: float = 4.0,
            threat: str = "gradient", lr: float = 0.5):  # fmt: skip
    noise = dpsgd_noise(eps, 1e-5, rate, steps)
    p = ta.build_problem(model="mlp", data="digits", noise=noise, rate=rate, steps=steps,
                         bug=bug, learning_rate=lr, canary_norm=norm, threat=threat)  # fmt: skip
    return dataclasses.replace(p, model=ta.make_model("mlp", 64, 10, hidden=HIDDEN))


def ceiling(mu: float, m: int, beta: float = 0.05) -> float:
    """The median ceiling of any finite-sample method valid for all mechanisms on N(mu, 1) scores.

    benchmarks/measured/one-run/exploration/finite_sample_ceiling.py (docs/theory/one_run.md 3b).
    """
    if not mu > 0:
        return 0.0
    cap = lambda e: min(1.0, beta + 1.0 - (1.0 - math.exp(-e) * gdp_delta(mu, e)) ** m) - 0.5
    return optimize.brentq(cap, 0.01, 60.0) if cap(0.01) > 0 else 0.0


def _eps(r, method):
    return r.bounds[method]["epsilon"]


def _row(results, label: str) -> dict:
    claim = results[0].claim_epsilon
    row = {"setting": label, "claim": claim, "runs": len(results), "m": results[0].canaries}
    for k in METHODS:
        vals = [_eps(r, k) for r in results]
        ok = [v for v in vals if v is not None]
        row[k] = float(np.median(ok)) if ok else None
        row[f"{k}_refused"] = len(vals) - len(ok)
    mus = [r.bounds["gaussian-scores"].get("mu_estimate") for r in results]
    mus = [x for x in mus if x is not None and math.isfinite(x)]
    row["mu_fitted"] = float(np.median(mus)) if mus else None
    row["ceiling"] = ceiling(row["mu_fitted"], results[0].canaries) if mus else None
    row["noise_ratio"] = float(np.median([r.noise_ratio for r in results]))
    row["seconds_per_run"] = results[0].seconds
    return row


def soundness(args) -> dict:
    p = problem(eps=2.0, rate=0.02, steps=300)
    res = ta.one_run_repeats(jax.random.key(0), p, args.runs, canaries=1000, chunk=8)
    claim = res[0].claim_epsilon
    counts = {k: sum((_eps(r, k) or 0.0) > claim for r in res) for k in METHODS}
    from cbdp_jax.one_run import one_run_audit

    post_hoc = sum(
        one_run_audit(r.scores, r.scores > np.median(r.scores), method="fdp").epsilon > claim
        for r in res
    )
    best = {k: float(max((_eps(r, k) or 0.0) for r in res)) for k in METHODS}
    family = list(res[0].critics)
    per_critic = {c: {k: sum((r.critic_bounds[c][k] or 0.0) > claim for r in res) for k in METHODS}
                  for c in family}  # fmt: skip
    largest_per_critic = {c: {k: float(max((r.critic_bounds[c][k] or 0.0) for r in res))
                              for k in METHODS} for c in family}  # fmt: skip
    return {"claim": claim, "runs": len(res), "above_claim": counts, "largest": best,
            "critics": family, "above_claim_per_critic": per_critic,
            "largest_per_critic": largest_per_critic,
            "negative_control_post_hoc_fdp_above_claim": int(post_hoc),
            "setting": "digits MLP(400), q=0.02, T=300, eps 2, m=1000 coordinate canaries"}  # fmt: skip


def bugs(args) -> dict:
    out = {}
    for bug in ("no-clip", "noise-after-averaging", "none"):
        p = problem(eps=2.0, rate=0.01, steps=1000, bug=bug, norm=100.0)
        r = ta.one_run_training(jax.random.key(1), p, canaries=1000, compare=False)
        name, eps = r.best()
        out[bug] = {"claim": r.claim_epsilon, "violation": r.violation, "best": name, "eps": eps,
                    "bounds": {k: _eps(r, k) for k in METHODS}, "seconds": r.seconds}  # fmt: skip
        print(bug, out[bug], flush=True)
    return out


def key_reuse(args) -> dict:
    """The planted bugs (default key-reuse: the same noise at every step) in one run each, m = 1,000,
    eps near 2, the default critic family (the score and the step-difference critic): the probes'
    defects, each method's bound and the critic that gave it.

    ``--rate``, ``--run-steps`` and ``--bugs`` pick the setting (the issue's: q 0.01, T 1,000).
    """
    out = {}
    for bug in args.bugs:
        p = problem(eps=2.0, rate=args.rate, steps=args.run_steps, bug=bug, norm=100.0)
        t = time.perf_counter()
        r = ta.one_run_training(jax.random.key(1), p, canaries=args.m, compare=False,
                                score=args.score)  # fmt: skip
        name, eps = r.best()
        out[bug] = {"claim": r.claim_epsilon, "violation": r.violation, "best": name, "eps": eps,
                    "certified_by": r.certified_by(), "critics": list(r.critics),
                    "bounds": {k: _eps(r, k) for k in METHODS},
                    "critic_bounds": r.critic_bounds,
                    "scores": {k: r.bounds[k]["score"] for k in METHODS},
                    "defects": [d.kind for d in r.defects], "verdict": r.verdict,
                    "setting": f"q={args.rate} T={args.run_steps} m={args.m}",
                    "seconds": time.perf_counter() - t, "load": os.getloadavg()}  # fmt: skip
        print(bug, out[bug], flush=True)
    return out


def black_box_crafted(args) -> dict:
    """Input canaries (ood) from the crafted start (worst-case and average-case), eps near 8."""
    from cbdp_jax.training_audit import crafted_problem

    rows = {}
    noise = dpsgd_noise(8.0, 1e-5, 0.01, 1000)
    for init in ("worst-case", "average-case"):
        p, report = crafted_problem(model="mlp", data="digits", n=None, init=init, noise=noise,
                                    rate=0.01, steps=1000)  # fmt: skip
        r = ta.one_run_training(jax.random.key(5), p, canaries=1000, kind="input", compare=False)
        rows[init] = {"claim": r.claim_epsilon, "bounds": {k: _eps(r, k) for k in METHODS},
                      "refused": {k: r.bounds[k].get("refused") for k in METHODS},
                      "start": report.to_dict(), "seconds": r.seconds}  # fmt: skip
        print(init, rows[init], flush=True)
    return rows


def tightness(args) -> dict:
    rows = []
    for eps in args.eps:
        p = problem(eps=eps, rate=0.01, steps=1000)
        res = ta.one_run_repeats(jax.random.key(int(eps)), p, args.runs, canaries=1000, chunk=8,
                                 score=args.score)  # fmt: skip
        rows.append(_row(res, f"q=0.01 T=1000 eps~{eps}, {args.score} score"))
        _save_scores(res, f"scores-eps{eps:g}-{args.score}")
        print(rows[-1], flush=True)
    if args.full_batch:
        p = problem(eps=8.0, rate=1.0, steps=10, lr=0.05)
        res = ta.one_run_repeats(jax.random.key(99), p, args.runs, canaries=1000, chunk=2)
        rows.append(_row(res, "full batch q=1 T=10 eps~8"))
        print(rows[-1], flush=True)
    return {"rows": rows}


def _save_scores(results, name: str) -> None:
    """The runs' scores and coins ``[R, m]`` (and the likelihood ratios, if any) as .npz."""
    arrays = {"sum": np.stack([r.scores for r in results]).astype(np.float32),
              "coins": np.stack([r.coins for r in results]),
              "claim": np.float64(results[0].claim_epsilon)}  # fmt: skip
    if results[0].llr is not None:
        arrays["llr"] = np.stack([r.llr for r in results]).astype(np.float32)
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / f"{name}.npz", **arrays)


def black_box(args) -> dict:
    p = problem(eps=8.0, rate=0.01, steps=1000, threat="black-box")
    res = ta.one_run_repeats(jax.random.key(5), p, args.runs, canaries=1000, kind="input", chunk=8)
    return {"rows": [_row(res, "input canaries (ood), default start, q=0.01 T=1000 eps~8")]}


def scale_one(m: int, steps: int, hidden: int = HIDDEN) -> dict:
    p = problem(eps=2.0, rate=0.01, steps=steps)
    p = dataclasses.replace(p, model=ta.make_model("mlp", 64, 10, hidden=hidden))
    t = time.perf_counter()
    r = ta.one_run_training(jax.random.key(2), p, canaries=m, compare=False,
                            directions="dense" if m > 1200 else "auto")  # fmt: skip
    secs = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB
    return {"m": m, "steps": steps, "directions": r.directions, "seconds": secs,
            "peak_rss_mib": peak, "params": 64 * hidden + hidden + hidden * 10 + 10,
            "m_x_p_matrix_mib": m * (75 * hidden + 10) * 4 / 2**20}  # fmt: skip


def scale(args) -> dict:
    rows = []
    for m in (1000, 10_000):
        cmd = [sys.executable, __file__, "scale-one", "--m", str(m), "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    return {"rows": rows}


def summary() -> None:
    """benchmarks/measured/one-run-training/summary.json: the must-show numbers of every section."""
    got = {f.stem: json.loads(f.read_text()) for f in sorted(OUT.glob("*.json"))
           if f.stem != "summary"}  # fmt: skip
    out = {}
    if "soundness" in got:
        s = got["soundness"]
        out["soundness"] = {k: s[k] for k in ("claim", "runs", "above_claim",
                                              "negative_control_post_hoc_fdp_above_claim")}  # fmt: skip
    if "bugs" in got:
        out["bugs"] = {k: {x: v[x] for x in ("claim", "violation", "best", "eps")}
                       for k, v in got["bugs"].items() if k != "meta"}  # fmt: skip
    keep = ("setting", "claim", "steinke", "fdp", "gaussian-scores", "mu_fitted", "ceiling",
            "noise_ratio")  # fmt: skip
    for name in ("tightness-full-batch", "tightness-llr", "black-box"):
        if name in got:
            out[name] = [{k: r.get(k) for k in keep} for r in got[name]["rows"]]
    if "score-choice" in got:
        out["score-choice"] = [
            {
                k: r[k]
                for k in (
                    "eps_target",
                    "m",
                    "runs",
                    "noise_multiplier",
                    "accountant_gdp_mu",
                    "median",
                    "ceiling",
                    "ratio_fdp_gauss_to_fitted_mu_ceiling",
                    "ratio_fdp_llr_to_mechanism_ceiling",
                )
            }  # fmt: skip
            for r in got["score-choice"]["rows"]
        ]
    if "vs-jax-privacy" in got:
        out["vs-jax-privacy"] = got["vs-jax-privacy"]["rows"]
    for name in ("key-reuse", "black-box-crafted"):
        if name in got:
            out[name] = {k: v for k, v in got[name].items() if k != "meta"}
    if "scale" in got:
        out["scale"] = got["scale"]["rows"] + got.get("scale-1e6", {}).get("rows", [])
    out["commands_and_load"] = {k: v["meta"] for k, v in got.items() if "meta" in v}
    (OUT / "summary.json").write_text(json.dumps(out, indent=2, default=float))
    print(json.dumps(out, indent=2, default=float))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("section", choices=("soundness", "bugs", "key-reuse", "tightness", "black-box",
                                        "black-box-crafted", "scale", "scale-one", "summary"))  # fmt: skip
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--eps", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    ap.add_argument("--full-batch", action="store_true")
    ap.add_argument("--score", choices=("sum", "llr"), default="sum")
    ap.add_argument("--m", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--run-steps", type=int, default=1000)
    ap.add_argument("--bugs", nargs="+", default=["key-reuse", "none"])
    args = ap.parse_args()
    if args.section == "summary":
        return summary()
    if args.section == "scale-one":
        print(json.dumps(scale_one(args.m, args.steps, args.hidden)))
        return
    t = time.perf_counter()
    fn = {"soundness": soundness, "bugs": bugs, "key-reuse": key_reuse, "tightness": tightness,
          "black-box": black_box, "black-box-crafted": black_box_crafted,
          "scale": scale}[args.section]  # fmt: skip
    payload = fn(args)
    payload["meta"] = {
        "command": " ".join(["python", "benchmarks/one_run_training.py", *sys.argv[1:]]),
        "seconds": time.perf_counter() - t, "load": os.getloadavg(), "commit": git_commit(),
        "device": str(jax.devices()[0]), "accountant": "PLD, add-remove, delta 1e-5",
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    name = args.section + ("-full-batch" if args.full_batch and args.section == "tightness" else "")
    name += "-llr" if args.score == "llr" else ""
    (OUT / f"{name}.json").write_text(json.dumps(payload, indent=2, default=float))
    print(json.dumps(payload, indent=2, default=float))


if __name__ == "__main__":
    main()
