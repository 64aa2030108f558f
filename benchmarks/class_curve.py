"""The adversary-class curve of DP-SGD: what adversaries of growing capacity certify on the same runs.

For each setting, ``--runs`` trainings per side are run once (cbdp_jax._src.training_auditor.class_curve) and each
adversary class is certified on the same held-out runs (95%, delta = 1e-5, its own Bonferroni
family): a threshold on the canary's final loss (black-box), a linear and an MLP critic of the final
parameters, the white-box projection on the canary's gradient, and the likelihood ratio of every
update along it (all updates seen). Two settings:

* ``logreg-full``: logistic regression on 1,000 digits, full batch, T = 100, theoretical eps 10,
  the default initialisation and the library's default input canary (what ``cbdp audit-training
  --threat black-box`` audits today);
* ``mlp-poisson``: the 2-layer MLP on 1,000 digits, Poisson q = 0.1, T = 100, eps 10, worst-case
  initial parameters and the crafted canary (cbdp_jax._src.training_auditor.crafted_init).

    python benchmarks/class_curve.py --device cpu --runs 10000 \\
        --out benchmarks/measured/class-curve/summary.json
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

DELTA = 1e-5
SETTINGS = {
    "logreg-full": dict(model="logreg", rate=1.0, init="average-case", canary="default"),
    "mlp-poisson": dict(model="mlp", rate=0.1, init="worst-case", canary="crafted"),
}


def _problem(setting: dict, args):
    from cbdp_jax import training_audit as ta
    from cbdp_jax.training_audit import crafted_problem, dpsgd_noise

    noise = dpsgd_noise(args.epsilon, DELTA, setting["rate"], args.steps)
    problem, report = crafted_problem(
        model=setting["model"], n=args.examples, init=setting["init"], noise=noise,
        rate=setting["rate"], steps=args.steps, chunk=args.chunk,
    )  # fmt: skip
    if setting["canary"] == "default":
        x, y = problem.data
        problem = dataclasses.replace(problem, canary=ta.input_canary(np.asarray(x), np.asarray(y)))
    return problem, report, noise


def one(name: str, args) -> dict:
    from cbdp_jax.training_audit import class_curve

    setting = SETTINGS[name]
    problem, report, noise = _problem(setting, args)
    print(f"{name}: S = {noise:.4f}, {report}", flush=True)
    t0 = time.perf_counter()
    curve = class_curve(jax.random.key(args.seed), problem, runs=args.runs, delta=DELTA)
    out = {
        "setting": name, **setting, "examples": args.examples, "steps": args.steps,
        "noise": noise, "seconds": time.perf_counter() - t0, "start": report.to_dict(),
        "load": list(os.getloadavg()), **curve.to_dict(),
    }  # fmt: skip
    rows = [
        {"class": p.adversary, "sees": p.features, "eps": p.epsilon, "mu": p.mu,
         "family": p.family, "s": p.seconds} for p in curve.points
    ]  # fmt: skip
    _common.print_table(f"{name}: certified at 95% (accountant eps {curve.claimed_epsilon:.3g})",
                        rows, list(rows[0]))  # fmt: skip
    return out


def figure(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for r, marker in zip(results, "os", strict=False):
        names = [p["adversary"] for p in r["points"]]
        x = np.arange(len(names))
        label = f"{r['setting']} (accountant eps {r['claimed_epsilon']:.3g})"
        axes[0].plot(x, [p["epsilon"] for p in r["points"]], marker=marker, label=label)
        axes[1].plot(x, [p["mu"] for p in r["points"]], marker=marker, label=r["setting"])
        for ax in axes:
            ax.set_xticks(x, names, rotation=20)
    axes[0].set_ylabel("certified eps at delta 1e-5 (95%)")
    axes[1].set_ylabel("certified GDP mu (95%)")
    full = [r for r in results if r["rate"] == 1.0]
    if full:
        mu = np.sqrt(full[0]["steps"]) / full[0]["noise"]
        axes[1].axhline(mu, ls="--", c="grey", lw=1, label=f"full batch: mu = sqrt(T)/S = {mu:.3g}")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle(
        f"DP-SGD on digits: adversary classes of growing capacity, {results[0]['runs']} runs per "
        "side, the same runs for every class"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], "benchmarks/measured/class-curve/summary.json")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--epsilon", type=float, default=10.0)
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    _common.setup_device(args.device)
    jax.config.update("jax_default_matmul_precision", "highest")  # as black_box.py: no TF32
    if args.quick:
        args.runs, args.examples = min(args.runs, 1000), min(args.examples, 300)
    results = [one(name, args) for name in args.settings.split(",")]
    out = Path(args.out)
    _common.write(out, "class_curve", args, {"delta": DELTA, "results": results})
    figure(results, out.with_name("curve.png"))


if __name__ == "__main__":
    main()
