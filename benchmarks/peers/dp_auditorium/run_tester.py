"""DP-Auditorium's side of benchmarks/vs_dp_auditorium.py; runs in DP-Auditorium's own venv (setup.sh).

Two jobs, each in a fresh process started by the benchmark:

``draw``: samples of DP-Auditorium's own ``MeanMechanism`` (mechanisms/mean.py) on the neighbouring
pair D1 = [0.0], D2 = [0.0, 1.0] (add/remove, as its ``VizierScalarDataAddRemoveGenerator`` builds
them: D1 = params[:-1], D2 = params), epsilon = 1, delta = 0 (the Laplace mean), configured as
``mechanisms_utils.default_mean_mechanism_config_generator`` does for ``non_private_mean_v1`` (true
counts) or ``non_private_mean_v2`` (a noised count in the noise scale). One generator
``np.random.default_rng(seed)`` draws P = M(D1) then Q = M(D2), as ``PrivacyTestRunner`` does.

``test``: its ``RenyiPropertyTester`` on saved samples, as ``PrivacyTestRunner.test_privacy`` runs it
on one pair: ``estimate_lower_bound`` in both directions, the maximum. Settings: the default base
model (``make_default_renyi_base_model``, Dense 100-100 tanh), the training configuration of its
Renyi tests (renyi_tester_test.py: 5 epochs, batch 128, learning rate 1e-3, critic bound 1.6), pure-DP
property epsilon (threshold min(eps, 2 alpha eps^2)), failure probability 0.05 per direction (the
runner example's). The first call (tester built, model traced) is the cold call; then ``--repeats``
warm calls on the same tester. Writes one JSON with bounds and wall / CPU seconds.

Usage (DP-Auditorium venv):
  python run_tester.py draw --mechanism v2 --n 10000 --seed 0 --out s.npz
  python run_tester.py test --samples s.npz --alpha 2 --seed 0 --repeats 1 --result r.json
"""

from __future__ import annotations

import time

T_START = time.perf_counter()
CPU_START = time.process_time()

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/peers
import worker_result  # noqa: E402

D1 = np.array([0.0])
D2 = np.array([0.0, 1.0])
FAILURE_PROBABILITY = 0.05
TRAINING = {
    "training_epochs": 5,
    "batch_size": 128,
    "optimizer_learning_rate": 1e-3,
    "model_output_coordinate_bound": 1.6,
}


def draw(mechanism: str, n: int, seed: int, epsilon: float, out: str) -> None:
    """Saves n outputs of the mean mechanism on D1 (as p) and on D2 (as q)."""
    from dp_auditorium.mechanisms import mean, mechanisms_utils

    name = {"v1": "non_private_mean_v1", "v2": "non_private_mean_v2"}[mechanism]
    config = mechanisms_utils.default_mean_mechanism_config_generator(name, epsilon=epsilon)
    mech = mean.MeanMechanism(config, np.random.default_rng(seed))
    p, q = mech(D1, n), mech(D2, n)
    np.savez(out, p=p, q=q)


def make_tester(alpha: float, epsilon: float, bound: float):
    """DP-Auditorium's Renyi tester with its default model and its tests' training settings."""
    from dp_auditorium.configs import privacy_property, property_tester_config
    from dp_auditorium.testers import renyi_tester

    training = property_tester_config.TrainingConfig(
        **{**TRAINING, "model_output_coordinate_bound": bound}
    )
    config = property_tester_config.RenyiPropertyTesterConfig(
        alpha=alpha,
        training_config=training,
        privacy_property=privacy_property.PrivacyProperty(
            pure_dp=privacy_property.PureDp(epsilon=epsilon)
        ),
    )
    return renyi_tester.RenyiPropertyTester(
        config, base_model=renyi_tester.make_default_renyi_base_model()
    )


def one_call(tester, p, q) -> dict:
    """Both directions, as the runner does; the maximum is the reported bound (NaN counts as none)."""
    w0, c0 = time.perf_counter(), time.process_time()
    pq = float(tester.estimate_lower_bound(p, q, FAILURE_PROBABILITY))
    qp = float(tester.estimate_lower_bound(q, p, FAILURE_PROBABILITY))
    finite = [b for b in (pq, qp) if math.isfinite(b)]
    return {
        "bound": max(finite) if finite else float("nan"),
        "bound_pq": pq,
        "bound_qp": qp,
        "rejects": bool(tester.reject_property(max(finite))) if finite else False,
        "wall_s": time.perf_counter() - w0,
        "cpu_s": time.process_time() - c0,
    }


def test(args: argparse.Namespace) -> None:
    """The cold call and the warm repeats; writes the result JSON."""
    import tensorflow as tf
    from dp_auditorium.testers import renyi_tester  # noqa: F401  (the import is part of the cold time)

    import_s, import_cpu = time.perf_counter() - T_START, time.process_time() - CPU_START
    data = np.load(args.samples)
    p, q = data["p"].reshape(-1, 1), data["q"].reshape(-1, 1)
    tf.keras.utils.set_random_seed(args.seed)
    w0, c0 = time.perf_counter(), time.process_time()
    tester = make_tester(args.alpha, args.epsilon, args.bound)
    build = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}
    cold = one_call(tester, p, q)
    cold["wall_s"] += build["wall_s"]
    cold["cpu_s"] += build["cpu_s"]
    warm = [one_call(tester, p, q) for _ in range(args.repeats)]
    worker_result.write(
        args.result,
        tool="dp_auditorium",
        import_s=import_s,
        import_cpu_s=import_cpu,
        cold=cold,
        warm=warm,
        settings={
            **TRAINING,
            "model_output_coordinate_bound": args.bound,
            "failure_probability_per_direction": FAILURE_PROBABILITY,
            "alpha": args.alpha,
            "pure_dp_epsilon": args.epsilon,
            "base_model": "make_default_renyi_base_model (Dense 100 tanh, 100 tanh, 1)",
        },
        versions={"tensorflow": tf.__version__, "numpy": np.__version__},
        threads=os.cpu_count(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="job", required=True)
    d = sub.add_parser("draw")
    d.add_argument("--mechanism", choices=("v1", "v2"), required=True)
    d.add_argument("--n", type=int, required=True)
    d.add_argument("--seed", type=int, required=True)
    d.add_argument("--epsilon", type=float, default=1.0)
    d.add_argument("--out", required=True)
    t = sub.add_parser("test")
    t.add_argument("--samples", required=True)
    t.add_argument("--alpha", type=float, required=True)
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--epsilon", type=float, default=1.0)
    t.add_argument("--bound", type=float, default=TRAINING["model_output_coordinate_bound"])
    t.add_argument("--repeats", type=int, default=1)
    t.add_argument("--result", required=True)
    args = parser.parse_args()
    if args.job == "draw":
        draw(args.mechanism, args.n, args.seed, args.epsilon, args.out)
    else:
        test(args)


if __name__ == "__main__":
    main()
