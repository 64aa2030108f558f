"""Normalisation leaks and the neighbouring relation: what add/remove and zero-out audits certify.

DP-SGD steps that divide the noisy sum by something other than a constant leak more than the
Poisson-subsampled Gaussian accountant says under add/remove, and zero-out sees little or none of it
(docs/theory/training_audit.md, section 1.1). On the worst-case data (every other example's
clipped gradient -C along the one weight, the canary +C; ``worst_case_problem``), T = 16 steps,
noise S = 1, Poisson q = 1/16 (claim 2.242 at delta = 1e-5 under both relations):

* the library's DP-SGD (divides by the expected batch) and ``optax.contrib.dpsgd`` (divides by the
  physical batch), add/remove: the claim holds;
* ``dp_sgd(bug='mean-over-batch')`` (divides by the sampler's count of slots, a zeroed canary's
  slot included) under add/remove and under zero-out, expected batch 8 and 16;
* a user-written step that divides by the number of non-zero per-example gradients, under both;

and full-batch training (q = 1, T = 10, S = 6, claim 2.114) that divides by the data set's size
(a step per data set, ``bug='mean-over-dataset'``), under zero-out and add/remove.

For each case: the number of 20 independent audits (2 x 10^4 runs per side, level 0.95, the run's own
``dpsgd:`` claim under the relation audited) that certify a violation, the median empirical eps, and
the TRUE eps at delta = 1e-5 of the pair the audit compares, computed numerically (this script's
own code): each step releases one number (the canary's coordinate) whose law on D and on D' is a
mixture over the number k of other examples in the batch (Binomial(n, q)) of Gaussians; the
per-step privacy loss is discretised on a fine grid, composed T times by FFT and read as
delta(eps) = E_P[(1 - e^(eps - L))_+], both directions. The same code on the accountant's own pair
reproduces dp_accounting's eps (asserted within 0.5%), which checks it. ``--big-runs N`` adds one
audit of N runs per side for the zero-out cases (how far zero-out gets with many runs).

    python benchmarks/training_relations.py --device cpu \\
        --out benchmarks/measured/training-relations/summary.json
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, setup_device, write  # noqa: E402

from cbdp_jax._src.mechanism_auditor.loading import import_attribute  # noqa: E402
from cbdp_jax._src.privacy.accounting import dpsgd_epsilon  # noqa: E402
from cbdp_jax.audit import parse_claim  # noqa: E402
from cbdp_jax.training_audit import (  # noqa: E402
    audit_training,
    default_claim,
    training_audit_config,
    worst_case_problem,
)

DELTA = 1e-5
CURVE = (0.25, 0.5, 1.0, 2.0)  # where the true delta(eps) is compared with the claim's


# A user's step in a user's file (docs/examples/), loaded as `--problem`-style specs are.
dividing_step = import_attribute(
    "step",
    f"{Path(__file__).resolve().parents[1] / 'docs' / 'examples' / 'dividing_step.py'}:dividing_step",
)


# --- the true eps of the pair each audit compares ------------------------------------------------


def _mixture(components, y):
    """Density of sum_i w_i N(m_i, s_i^2) on the grid y."""
    out = np.zeros_like(y)
    for w, m, s in components:
        out += w * stats.norm.pdf(y, m, s)
    return out


def _laws(case: dict) -> tuple[list, list]:
    """The per-step laws of the canary's coordinate on D and on D' (in units of C / divisor 1).

    Each is a list of (weight, mean, std). Other examples: k ~ Binomial(n, q) (k = n at q = 1),
    each contributing -1; the canary +1; noise S. ``divide``: 'constant' (the expected batch B),
    'slots' (the count of slots, a zeroed slot counting), 'nonzero' (non-zero rows), 'size'.
    """
    n, q, s, relation, divide = (case[k] for k in ("others", "rate", "noise", "relation", "divide"))
    ks = np.arange(n + 1)
    pk = stats.binom.pmf(ks, n, q) if q < 1 else (ks == n).astype(float)
    keep = pk > 1e-15
    ks, pk = ks[keep], pk[keep]
    expected = q * (n + 1)

    def one(count_fn, sum_fn, weight):
        comps = []
        for k, w in zip(ks, pk, strict=True):
            c = count_fn(k)
            comps.append((weight * w, sum_fn(k) / c, s / c))
        return comps

    def divisor(k, slot_counts, slot_present, side_size):
        if divide == "constant":
            return expected
        if divide == "size":
            return side_size
        return max(k + (1 if (slot_counts and slot_present) else 0), 1)

    n_d = n + 1
    n_out = n if relation == "add-remove" else n + 1
    if q >= 1:  # full batch: the slot is always in the batch
        d = one(lambda k: divisor(k, True, True, n_d), lambda k: 1.0 - k, 1.0)
        zero_counts = relation == "zero-out" and divide == "slots"
        d2 = one(lambda k: divisor(k, zero_counts, True, n_out), lambda k: -float(k), 1.0)
        return d, d2
    d = one(lambda k: divisor(k, True, True, n_d), lambda k: 1.0 - k, q) + one(
        lambda k: divisor(k, False, False, n_d), lambda k: -float(k), 1 - q
    )
    zero_counts = relation == "zero-out" and divide == "slots"
    d2 = one(lambda k: divisor(k, zero_counts, True, n_out), lambda k: -float(k), q) + one(
        lambda k: divisor(k, False, False, n_out), lambda k: -float(k), 1 - q
    )
    return d, d2


def _loss_pmf(p_comps, q_comps, dl: float, up: bool) -> tuple[np.ndarray, int]:
    """The per-step privacy loss log p/q under P, on the grid dl Z (rounded up or down)."""
    lo = min(m - 14 * s for _, m, s in p_comps + q_comps)
    hi = max(m + 14 * s for _, m, s in p_comps + q_comps)
    h = min(s for _, _, s in p_comps + q_comps) / 400
    y = np.arange(lo, hi, h)
    p, q = _mixture(p_comps, y), _mixture(q_comps, y)
    keep = p > 0
    mass = p[keep] * h
    mass /= mass.sum()
    # losses beyond +-50 are capped there (delta at eps < 40 counts such mass in full either way)
    loss = np.clip(np.log(p[keep]) - np.log(np.maximum(q[keep], 1e-300)), -50.0, 50.0)
    idx = np.ceil(loss / dl) if up else np.floor(loss / dl)
    idx = idx.astype(np.int64)
    base = int(idx.min())
    pmf = np.bincount(idx - base, weights=mass)
    return pmf, base


def _compose(pmf: np.ndarray, base: int, steps: int) -> tuple[np.ndarray, int]:
    size = steps * (len(pmf) - 1) + 1
    nfft = 1 << (size - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(pmf, nfft) ** steps, nfft)[:size]
    return np.clip(out, 0.0, None), steps * base


def _delta(pmf, base, dl, eps) -> float:
    loss = (base + np.arange(len(pmf))) * dl
    return float(np.sum(pmf * np.clip(1.0 - np.exp(eps - loss), 0.0, None)))


def _eps_at(pmf, base, dl, delta) -> float:
    lo, hi = 0.0, 60.0
    if _delta(pmf, base, dl, 0.0) <= delta:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _delta(pmf, base, dl, mid) > delta else (lo, mid)
    return hi


def true_epsilon(p_comps, q_comps, steps: int, delta: float = DELTA, dl: float = 2e-3,
                 curve_at: tuple[float, ...] = ()) -> dict:  # fmt: skip
    """eps at delta of T steps of the pair (both directions), with the losses rounded up and down,
    and the delta(eps) curve (rounded up: an upper estimate) at ``curve_at``."""
    out = {}
    for up in (True, False):
        best, curve = 0.0, dict.fromkeys(curve_at, 0.0)
        for a, b in ((p_comps, q_comps), (q_comps, p_comps)):
            pmf, base = _loss_pmf(a, b, dl, up)
            pmf, base = _compose(pmf, base, steps)
            best = max(best, _eps_at(pmf, base, dl, delta))
            for e in curve_at:
                curve[e] = max(curve[e], _delta(pmf, base, dl, e))
        out["upper" if up else "lower"] = best
        if up and curve_at:
            out["delta_curve"] = [{"epsilon": e, "delta": d} for e, d in curve.items()]
    return out


def _check_against_the_accountant(noise: float, rate: float, steps: int) -> dict:
    """The accountant's own pair, (1 - q) N(0) + q N(1) against N(0), through this code."""
    d = [(1 - rate, 0.0, noise), (rate, 1.0, noise)]
    got = true_epsilon(d, [(1.0, 0.0, noise)], steps)
    want = dpsgd_epsilon(noise, rate, steps, DELTA)
    assert got["lower"] <= want * 1.005 and got["upper"] >= want * 0.995, (got, want)
    return {"this_code": got, "dp_accounting": want}


def exact_score(law: dict):
    """The exact log-likelihood ratio of the T released coordinates, sum_t log p_D(z_t) / p_D'(z_t).

    For the cases whose lone-canary unit is C / 1 (a division by a count: the released z is the
    noisy mean in units of C), as a JAX function of z [T] for ``TrainingProblem(score=...)``.
    """
    d, d2 = _laws(law)

    def log_density(comps, z):
        w, m, sd = (jnp.asarray([c[i] for c in comps], jnp.float32) for i in range(3))
        terms = jnp.log(w) - 0.5 * ((z[:, None] - m) / sd) ** 2 - jnp.log(sd)
        return jax.nn.logsumexp(terms, axis=1)

    return lambda z: jnp.sum(log_density(d, z) - log_density(d2, z))


# --- the audits ------------------------------------------------------------------------------------


def _cases() -> dict:
    w = dict(steps=16, noise=1.0, sampler="poisson")
    full = dict(steps=10, noise=6.0, sampler="poisson", rate=1.0, batch_size=8)
    user = lambda **kw: dataclasses.replace(
        worst_case_problem(**w, batch_size=8, **kw), step=dividing_step(1e-6, 1.0, 1.0)
    )
    law = lambda b, relation, divide, **kw: {
        "others": 16 * b - 1, "rate": 1 / 16, "noise": 1.0, "relation": relation,
        "divide": divide, "steps": 16,
    } | kw  # fmt: skip
    full_law = lambda relation: law(8, relation, "size", others=79, rate=1.0, noise=6.0, steps=10)
    return {
        "dp-sgd, add-remove, b=8": (
            lambda: worst_case_problem(**w, batch_size=8),
            law(8, "add-remove", "constant"),
        ),
        "optax.contrib.dpsgd, add-remove, b=8": (
            lambda: worst_case_problem(**w, batch_size=8, step="optax"),
            None,  # divides by the physical batch, a constant: the law of dp-sgd up to scale
        ),
        "mean-over-batch, add-remove, b=8": (
            lambda: worst_case_problem(**w, batch_size=8, bug="mean-over-batch"),
            law(8, "add-remove", "slots"),
        ),
        "mean-over-batch, zero-out, b=8": (
            lambda: worst_case_problem(
                **w, batch_size=8, bug="mean-over-batch", relation="zero-out"
            ),
            law(8, "zero-out", "slots"),
        ),
        "mean-over-batch, zero-out, b=16": (
            lambda: worst_case_problem(
                **w, batch_size=16, bug="mean-over-batch", relation="zero-out"
            ),
            law(16, "zero-out", "slots"),
        ),
        "user's non-zero count, add-remove, b=8": (lambda: user(), law(8, "add-remove", "nonzero")),
        "user's non-zero count, zero-out, b=8": (
            lambda: user(relation="zero-out"),
            law(8, "zero-out", "nonzero"),
        ),
        "full batch / data set size, zero-out": (
            lambda: worst_case_problem(**full, bug="mean-over-dataset", relation="zero-out"),
            full_law("zero-out"),
        ),
        "full batch / data set size, add-remove": (
            lambda: worst_case_problem(**full, bug="mean-over-dataset"),
            full_law("add-remove"),
        ),
    } | {
        f"mean-over-batch, {rel}, b={b}, exact score": (
            lambda rel=rel, b=b: dataclasses.replace(
                worst_case_problem(**w, batch_size=b, bug="mean-over-batch", relation=rel),
                score=exact_score(law(b, rel, "slots")),
            ),
            law(b, rel, "slots"),
        )
        for rel, b in (("add-remove", 8), ("zero-out", 8), ("zero-out", 16))
    }


def audit_many(problem, runs: int, repeats: int, seed: int) -> dict:
    claim = default_claim(problem, DELTA)
    config = training_audit_config(parse_claim(claim).epsilon, samples=runs)
    flagged, eps, t0 = 0, [], time.perf_counter()
    for r in range(repeats):
        res = audit_training(jax.random.key(seed + r), problem, claim, config=config)
        flagged += bool(res.violation)
        eps.append(float(res.empirical.epsilon))
    return {
        "claim": claim,
        "claim_epsilon": parse_claim(claim).epsilon,
        "runs_per_side": runs,
        "audits": repeats,
        "flagged": flagged,
        "median_empirical_epsilon": float(np.median(eps)),
        "max_empirical_epsilon": float(np.max(eps)),
        "blind_spots": [b.kind for b in res.blind_spots],
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = parser(__doc__.splitlines()[0], "benchmarks/measured/training-relations/summary.json")
    ap.add_argument("--runs", type=int, default=20_000, help="training runs per side per audit")
    ap.add_argument("--repeats", type=int, default=20, help="independent audits per case")
    ap.add_argument("--big-runs", type=int, default=0, help="one more audit (zero-out cases)")
    ap.add_argument("--only", nargs="*", default=None, help="case names (substrings)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    setup_device(args.device)
    check = _check_against_the_accountant(1.0, 1 / 16, 16)
    print(f"numerics check, the accountant's own pair: {check}", flush=True)
    rows = []
    for name, (build, law) in _cases().items():
        if args.only and not any(s in name for s in args.only):
            continue
        row = {"case": name}
        problem = build()
        claim = parse_claim(default_claim(problem, DELTA))
        if law is not None:
            d, d2 = _laws(law)
            row["true_epsilon"] = true_epsilon(d, d2, law["steps"], curve_at=CURVE)
            for point in row["true_epsilon"]["delta_curve"]:
                point["claimed"] = claim.source.delta_at(point["epsilon"])
        row |= audit_many(problem, args.runs, args.repeats, args.seed)
        if args.big_runs and "zero-out" in name:
            big = audit_many(build(), args.big_runs, 1, args.seed + 1000)
            row["big"] = {k: big[k] for k in ("runs_per_side", "flagged", "max_empirical_epsilon")}
        rows.append(row)
        truth = row.get("true_epsilon", {}).get("upper", math.nan)
        print(
            f"{name}: {row['flagged']} of {row['audits']} flagged, median empirical eps "
            f"{row['median_empirical_epsilon']:.3f}, claim {row['claim_epsilon']:.3f}, true eps "
            f"{truth:.3f}{', big: ' + str(row['big']) if 'big' in row else ''} "
            f"({row['seconds']:.0f} s)",
            flush=True,
        )
    write(args.out, "training_relations", args, {"delta": DELTA, "check": check, "rows": rows})


if __name__ == "__main__":
    main()
