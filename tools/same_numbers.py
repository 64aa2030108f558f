"""Estimates that a change meant to make the library faster may not change: run in two trees, compare.

A fixed set of ``estimate_from_samples`` calls (Laplace, Gaussian, and atoms with outliers; an MLP's
finite-sample Renyi bound with the automatic input map, the linear class's KL, an MLP's asymptotic KL;
one direction and both) and one ``estimate`` of a mechanism. Every field of every result except the
wall time and the environment goes to one JSON file, so two runs compare with ``cmp``:

    git worktree add /tmp/before BASE
    PYTHONPATH=/tmp/before python tools/same_numbers.py /tmp/before.json
    python tools/same_numbers.py /tmp/after.json
    cmp /tmp/before.json /tmp/after.json && echo identical

A few minutes on 2 CPU cores. Where a change moves the last float32 bits on purpose (a sum over
padded rows in another order), ``--compare BEFORE AFTER`` compares the two files field by field:
equal strings and flags, numbers within a relative tolerance (``--rtol``, default 1e-3; numbers
inside a message also within one unit of their last printed digit; a Hill tail index I within
10^-6 I^2 more), and prints the largest difference of each field. Why 1e-3: the estimates' standard errors at these sizes are 1-10% of
their values, so a difference 30-100 times below them changes no conclusion, while it still catches a
change of method (a different split, minibatch, member or map moves a bound by percents).

A change of the last bit of the inputs' standardisation (or of any starting point of training) is
amplified by a few hundred Adam steps: a record whose training or validation curve moved by more
than rounding (1e-5 relative; a sum in another order moves them by about 1e-7) has trained another
critic, and its numbers move like those of a rerun. For such a record (listed as "trajectory
moved") only its lower bound is compared, within ``--se`` (default 2) standard errors of its
estimate, and the estimates are printed beside it: a systematic shift of the method still fails, the
chaos of training does not.

``--training`` writes the training engine's numbers instead (:func:`run_training`): the scores of
256 runs on D and on D' at fixed keys, for logistic regression and the MLP on the digits, a shuffled
and a fixed-size sampler, the optax step and a planted bug, each problem's runs in blocks of 64
(``sharded_runs`` with a fixed chunk, so no timing decides a block's size), and three whole
training audits (their result records, the times left out). Run it in both trees and ``cmp`` the
two files (the same draws: identical); where a change moves the draws on purpose, ``--training
--compare BEFORE AFTER`` compares each case's scores as samples of one law (a two-sample KS test at
level 1e-3, the means in standard errors) and the audits' verdicts (:func:`compare_training`):

    PYTHONPATH=/tmp/before python tools/same_numbers.py --training /tmp/before-training.json
    python tools/same_numbers.py --training /tmp/after-training.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re

import jax
import numpy as np

from cbdp_jax.estimator import EstimatorConfig, estimate, estimate_from_samples
from cbdp_jax.mechanisms import LaplaceMechanism

# The budget settings every call fixes (the defaults these had before the default budget was derived
# from the sample size), so that the same calls run in a tree before that change and after it.
FIXED = {"eval_every": 100, "patience": None}

CLASSES = (
    ("mlp", "renyi", 2.0, "finite-sample", "auto"),
    ("linear", "kl", None, "auto", "standard"),
    ("mlp", "kl", None, "asymptotic", "standard"),
)


def _samples(case: str, seed: int, n: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if case == "laplace":
        return rng.laplace(0, 1, n), rng.laplace(1, 1, n)
    if case == "gaussian":
        return rng.normal(0, 1, n), rng.normal(1, 1, n)
    spike = rng.random(n) < 0.01  # atoms beside a heavy tail: the input maps' case
    p = np.where(rng.random(n) < 0.3, 0.0, rng.laplace(0, 1, n) * np.where(spike, 1e5, 1))
    q = np.where(rng.random(n) < 0.3, 0.5, rng.laplace(0.5, 1, n) * np.where(spike, 1e5, 1))
    return p, q


def _record(res) -> dict:
    skip = {"seconds", "environment", "reverse"}
    out = {f.name: getattr(res, f.name) for f in dataclasses.fields(res) if f.name not in skip}
    if res.reverse is not None:
        out["reverse"] = _record(res.reverse)
    return jax.tree.map(lambda v: np.asarray(v).tolist(), out)


def run() -> list[dict]:
    """Every estimate of the set, as records of all their fields (the reverse direction nested)."""
    rows = []
    for case in ("laplace", "gaussian", "atoms"):
        for seed, both in ((0, True), (1, False)):
            p, q = _samples(case, seed)
            for adversary, divergence, alpha, guarantee, input_map in CLASSES:
                cfg = EstimatorConfig(
                    steps=200, ensemble=2, batch_size=512, both_directions=both,
                    guarantee=guarantee, input_map=input_map, **FIXED,
                )  # fmt: skip
                options = {"width": 16, "depth": 2} if adversary == "mlp" else {}
                res = estimate_from_samples(
                    jax.random.key(seed), p, q, adversary=adversary, divergence=divergence,
                    alpha=alpha, config=cfg, **options,
                )  # fmt: skip
                rows.append({"case": case, "seed": seed, "adversary": adversary,
                             "divergence": divergence, "result": _record(res)})  # fmt: skip
                print(case, seed, adversary, divergence, res.lower_bound, flush=True)
    res = estimate(
        jax.random.key(5), LaplaceMechanism(epsilon=1.0), adversary="mlp", divergence="kl",
        samples=20_000,
        config=EstimatorConfig(steps=200, ensemble=2, batch_size=4096, both_directions=True, **FIXED),
    )  # fmt: skip
    rows.append({"case": "mechanism", "result": _record(res)})
    return rows


TRAINING = (  # (name, build_problem options): every sampler, both models, the optax step, a bug
    ("logreg digits", {"model": "logreg", "data": "digits", "rate": 0.01, "steps": 20}),
    ("mlp digits", {"model": "mlp", "data": "digits", "rate": 0.01, "steps": 20}),
    ("tight synthetic", {"data": "synthetic", "n": 63, "rate": 0.125, "steps": 16, "noise": 0.5}),
    ("shuffle", {"data": "synthetic", "n": 63, "sampler": "shuffle", "batch_size": 8, "steps": 16}),
    ("fixed", {"data": "synthetic", "n": 63, "sampler": "fixed", "batch_size": 8, "steps": 16}),
    ("optax step", {"data": "synthetic", "n": 63, "rate": 0.125, "steps": 16, "step": "optax"}),
    ("no-clip", {"data": "synthetic", "n": 63, "rate": 0.125, "steps": 16, "bug": "no-clip"}),
    (
        "white-box",
        {"data": "synthetic", "n": 63, "rate": 0.125, "steps": 16, "threat": "white-box"},
    ),
)
AUDITED = ("tight synthetic", "shuffle", "no-clip")


def run_training(runs: int = 256, audit_runs: int = 2000, cases=None, out=None) -> list[dict]:
    """The training engine's scores at fixed keys, and a few audits' records (module docstring).

    ``cases``: the names of ``TRAINING`` to run (default all); ``out``: a file the rows so far are
    written to after each case (a run cut short keeps its cases).
    """
    from cbdp_jax import training_audit as ta
    from cbdp_jax._src.infra.sharded_runs import sharded_runs

    rows = []
    for name, options in TRAINING:
        if cases and name not in cases:
            continue
        problem = ta.build_problem(**options, chunk=64)
        prep = ta.prepare(problem)
        row = {"case": name, "options": options}
        for side in (1.0, 0.0):
            run = ta.make_run(problem, prep, side=side if problem.step_per_data_set else None)
            res = sharded_runs(run, jax.random.key(7), runs, np.float32(side), chunk=64)
            row[f"scores {side:g}"] = np.asarray(res.score).tolist()
            row[f"overflow {side:g}"] = int(np.sum(res.overflow))
        if name in AUDITED:
            config = ta.training_audit_config(1.0, samples=audit_runs)
            res = ta.audit_training(jax.random.key(8), problem, config=config)
            skip = {"seconds", "environment"}
            row["audit"] = {k: v for k, v in res.to_dict().items() if k not in skip}
        rows.append({"case": name, "result": row})
        print(name, np.mean(row["scores 1"]), np.mean(row["scores 0"]), flush=True)
        if out is not None:
            with open(out, "w") as fh:
                json.dump(rows, fh, default=str, indent=1)
    return rows


def compare_training(before: list[dict], after: list[dict], level: float = 1e-3) -> list[str]:
    """Where a case's scores moved (other draws): the laws compared, and the audits' verdicts.

    Per case and side, the two samples of scores (independent draws of the same law if only the
    draws changed) by a two-sample Kolmogorov-Smirnov test at ``level`` and their means in standard
    errors; the audits' verdict must be the same and their empirical eps are printed. Returns the
    failures (a KS p-value below ``level``, a verdict that changed).
    """
    from scipy import stats

    fails = []
    later = {row["case"]: row for row in after}
    for a in before:  # the cases both files hold
        if a["case"] not in later:
            continue
        b = later[a["case"]]
        ra, rb = a["result"], b["result"]
        for side in ("1", "0"):
            x, y = np.asarray(ra[f"scores {side}"]), np.asarray(rb[f"scores {side}"])
            if np.array_equal(x, y):
                print(f"{a['case']} side {side}: identical scores")
                continue
            p = stats.ks_2samp(x, y).pvalue
            se = math.sqrt(x.var() / x.size + y.var() / y.size)
            print(f"{a['case']} side {side}: scores moved; KS p = {p:.3g}, "
                  f"means {x.mean():.4g} -> {y.mean():.4g} ({abs(x.mean() - y.mean()) / se:.2f} SE)")  # fmt: skip
            if p < level:
                fails.append(f"{a['case']} side {side}: KS p = {p:.3g}")
        if "audit" in ra:
            va, vb = ra["audit"]["violation"], rb["audit"]["violation"]
            ea, eb = ra["audit"]["empirical"]["epsilon"], rb["audit"]["empirical"]["epsilon"]
            print(f"{a['case']} audit: violation {va} -> {vb}, empirical eps {ea:.4g} -> {eb:.4g}")
            if va != vb:
                fails.append(f"{a['case']} audit: violation {va} -> {vb}")
    return fails


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan")


def _as_float(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return None


def _unit(token: str) -> float:
    """One unit of the last printed digit of a number in a message (0 for an integer token)."""
    mantissa = token.lower().split("e")[0]
    exponent = int(token.lower().split("e")[1]) if "e" in token.lower() else 0
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 10.0 ** (exponent - decimals) if ("." in mantissa or "e" in token.lower()) else 0.0


def _close(a: float, b: float, rtol: float, unit: float = 0.0) -> tuple[bool, float]:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True, 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return False, math.inf
    diff = abs(a - b)
    rel = diff / max(abs(a), abs(b))
    return diff <= rtol * max(abs(a), abs(b)) + unit, rel


def compare(before, after, rtol: float, path: str = "", worst: dict | None = None) -> list[str]:
    """The differences beyond the tolerance between two records (and each field's largest, in ``worst``)."""
    worst = {} if worst is None else worst
    field = re.sub(r"\[\d+\]", "[]", path)
    fa, fb = _as_float(before), _as_float(after)
    if fa is not None and fb is not None:
        # Hill's index I is 1 / (mean log-spacing of the top order statistics): a relative change e
        # of the values moves it by about e * I relative (I = 2 x 10^4: by 2 x 10^-3 for e = 10^-7).
        unit = 1e-6 * fa * fa if "tail_index" in path and math.isfinite(fa) else 0.0
        ok, rel = _close(fa, fb, rtol, unit)
        worst[field] = max(worst.get(field, 0.0), rel)
        return [] if ok else [f"{path}: {before!r} -> {after!r}"]
    if isinstance(before, dict) and isinstance(after, dict):
        if before.keys() != after.keys():
            return [f"{path}: fields {sorted(before)} -> {sorted(after)}"]
        return [d for k in before for d in compare(before[k], after[k], rtol, f"{path}.{k}", worst)]
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} entries -> {len(after)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(before, after, strict=True))
            for d in compare(x, y, rtol, f"{path}[{i}]", worst)
        ]
    if isinstance(before, str) and isinstance(after, str):
        ta, tb = _NUMBER.findall(before), _NUMBER.findall(after)
        if _NUMBER.split(before) != _NUMBER.split(after) or len(ta) != len(tb):
            return [f"{path}: {before!r} -> {after!r}"]
        for x, y in zip(ta, tb, strict=True):
            ok, rel = _close(float(x), float(y), rtol, max(_unit(x), _unit(y)))
            worst[field] = max(worst.get(field, 0.0), rel)
            if not ok:
                return [f"{path}: {before!r} -> {after!r}"]
        return []
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


# A training or validation curve that moved by more than this (relative) took another path.
_MOVED = 1e-5


def _moved(a: dict, b: dict) -> bool:
    """Whether training took another path: a curve of either direction moved beyond rounding."""
    for x, y in ((a, b), (a.get("reverse"), b.get("reverse"))):
        if not x or not y or "curves" not in x:  # a training row: no critic's curves
            continue
        for curve in ("val_objective", "train_objective"):
            ca, cb = x["curves"].get(curve, []), y["curves"].get(curve, [])
            if len(ca) != len(cb) or compare(ca, cb, _MOVED):
                return True
    return False


def _within_errors(a: dict, b: dict, k: float) -> str:
    """Whether the bounds of two records agree within ``k`` standard errors (and how, estimates too)."""
    out = []
    for x, y in ((a, b), (a.get("reverse"), b.get("reverse"))):
        if not x or not y:
            continue
        se = max(float(x["std_error"]), float(y["std_error"]))
        for field in ("estimate", "lower_bound"):
            u, v = float(x[field]), float(y[field])
            if u == v:
                continue
            ratio = abs(u - v) / se if se > 0 and math.isfinite(se) else math.inf
            counted = ratio if field == "lower_bound" else 0.0
            out.append((counted, f"{field} {u:.6g} -> {v:.6g} ({ratio:.2f} SE)"))
    worst = max((r for r, _ in out), default=0.0)
    text = ", ".join(t for _, t in out) or "estimate and bound equal"
    return f"within {k:g} SE: {text}" if worst <= k else f"BEYOND {k:g} SE: {text}"


def main() -> None:
    """Writes the records to the JSON file named on the command line, or compares two files."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="JSON file to write")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two files")
    ap.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance of --compare")
    ap.add_argument("--se", type=float, default=2.0, help="standard errors, where training moved")
    ap.add_argument("--training", action="store_true", help="the training engine's numbers")
    ap.add_argument("--cases", nargs="*", default=None, help="--training: only these cases")
    args = ap.parse_args()
    if args.compare and args.training:
        fails = compare_training(*(json.load(open(f)) for f in args.compare))
        print("\n".join(f"DIFFERS {f}" for f in fails) or "the same laws and verdicts")
        raise SystemExit(1 if fails else 0)
    if args.compare:
        before, after = (json.load(open(f)) for f in args.compare)
        worst: dict[str, float] = {}
        diffs = []
        for i, (a, b) in enumerate(zip(before, after, strict=True)):
            if _moved(a["result"], b["result"]):
                moved = _within_errors(a["result"], b["result"], args.se)
                print(f"trajectory moved [{i}] {a.get('case')} {a.get('seed')} "
                      f"{a.get('adversary')} {a.get('divergence')}: {moved}")  # fmt: skip
                if not moved.startswith("within"):
                    diffs.append(f"[{i}]: {moved}")
                continue
            diffs += compare(a, b, args.rtol, f"[{i}]", worst)
        for field, rel in sorted(worst.items(), key=lambda kv: -kv[1]):
            if rel > 0:
                print(f"largest relative difference {rel:.2e}  {field}")
        for d in diffs:
            print("DIFFERS", d)
        print("identical" if not any(worst.values()) and not diffs else
              f"{len(diffs)} differences beyond rtol={args.rtol:g}")  # fmt: skip
        raise SystemExit(1 if diffs else 0)
    if args.training:
        run_training(cases=args.cases, out=args.out)
        return
    with open(args.out, "w") as fh:
        json.dump(run(), fh, default=str, indent=1)


if __name__ == "__main__":
    main()
