"""The adversary-class curve of DP training: what adversaries of growing capacity certify on the SAME runs.

A training audit certifies a lower bound on the hockey-stick divergence restricted to a class of
critics, D^H, of the pair (runs with the canary, runs without). Which class is a statement about the
adversary: what it sees of the training (the final model's loss on the canary, the final
parameters, every update) and what functions of that it can compute. :func:`class_curve` trains
the runs ONCE (input canary), records for every run what each adversary sees, and certifies each
class on the same held-out runs (the first ``train_fraction`` of each side fits the critics):

* ``'loss'``: a threshold on the canary's final loss (black-box: only the final model's loss);
* ``'linear'``: a linear critic (a half-space, or a trained sigmoid-linear function) of the final
  parameters;
* ``'mlp'``: a trained sigmoid(MLP 32x2) critic of the final parameters;
* ``'white-box'``: a threshold on the final parameters' move along the canary's negative gradient
  at the initialisation (a linear function of them chosen in advance);
* ``'all-updates'``: a threshold on the likelihood ratio of the T updates along that direction, in
  units of the step's response to the lone canary, under the law of the exact subsampled
  Gaussian (every update seen; Nasr et al. 2023).

Each point is the empirical epsilon at the claim's delta and the GDP mu refuted by that class's own
Bonferroni family (``audit``'s rows and :func:`~cbdp_jax._src.mechanism_auditor.epsilon.empirical_epsilon`) at the
given level: a finite-sample lower bound on that class's eps (or mu), not a joint statement across
classes. The final parameters are kept in full when the model has at most ``max_params`` of them,
else the ``max_params`` coordinates the canary's gradient moves most (a subset of the linear and MLP
critics of all parameters, so still a lower bound for those classes; the point says which).

References:
  Chaudhuri, Imola, Machanavajjhala 2019, "Capacity bounded differential privacy"; Nasr, Hayes,
  Steinke, Balle, Tramer, Jagielski, Carlini, Terzis 2023, "Tight auditing of differentially
  private machine learning"; Annamalai, De Cristofaro 2024 (black-box audits).

"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from cbdp_jax._src.infra.memo import remembered
from cbdp_jax._src.infra.validation import InvalidParameterError, check_int_at_least, check_key
from cbdp_jax._src.training_auditor.ops import Prepared, example_loss, lone_response, tree_dot
from cbdp_jax._src.training_auditor.prepare import prepare
from cbdp_jax._src.training_auditor.problem import TrainingProblem
from cbdp_jax._src.training_auditor.runs import _llr, make_run

ADVERSARIES = ("loss", "linear", "mlp", "white-box", "all-updates")
LABELS = {
    "loss": "threshold on the canary's final loss (black-box)",
    "linear": "linear critic of the final parameters",
    "mlp": "sigmoid(MLP 32x2) critic of the final parameters",
    "white-box": "threshold on the final parameters along the canary's gradient (white-box)",
    "all-updates": "likelihood ratio of every update along the canary's gradient (all updates)",
}
_CLASSES = {"linear": ("linear",), "mlp": ("mlp",)}


class CurvePoint(NamedTuple):
    """One adversary class's certified bounds on the curve's runs.

    Attributes:
      adversary: The key (``ADVERSARIES``).
      label: The class in words; for the parameter critics, which parameters they see.
      features: The dimension of what the critics see.
      epsilon: The empirical epsilon at the claim's delta (a lower bound at ``confidence``).
      mu: The largest GDP mu refuted at ``confidence``.
      family: The size of the class's Bonferroni family.
      seconds: Time to fit and certify the class's critics.

    """

    adversary: str
    label: str
    features: int
    epsilon: float
    mu: float
    family: int
    seconds: float


class ClassCurve(NamedTuple):
    """The curve: the points in the order asked, and what they were measured on."""

    points: tuple[CurvePoint, ...]
    claim: str
    claimed_epsilon: float
    delta: float
    confidence: float
    runs: int
    run_seconds: float

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        out = self._asdict()
        out["points"] = [p._asdict() for p in self.points]
        return out


def _sketch(prep: Prepared, max_params: int) -> tuple[np.ndarray | None, str]:
    """The flat coordinates the parameter critics see (None: all) and their description."""
    flat = np.asarray(ravel_pytree(prep.direction)[0])
    if flat.size <= max_params:
        return None, f"all {flat.size} parameters"
    keep = np.sort(np.argsort(-np.abs(flat))[:max_params])
    return keep, f"the {max_params} of {flat.size} parameters the canary's gradient moves most"


def _observer(problem: TrainingProblem, prep: Prepared, keep, unit: float):
    """``observe(final, z)`` of :func:`make_run`: what every adversary of the curve sees."""
    s2 = float(problem.noise_multiplier or 1.0) ** 2
    q, size = problem.sampling_rate, problem.examples
    x_c, y_c = prep.x[prep.slot], prep.y[prep.slot]
    idx = None if keep is None else jnp.asarray(keep)

    def observe(final, z):
        flat = ravel_pytree(final)[0]
        return {
            "loss": -example_loss(prep.loss, prep.graphdef, final, x_c, y_c),
            "params": flat if idx is None else flat[idx],
            "white-box": tree_dot(jax.tree.map(jnp.subtract, final, prep.params), prep.direction),
            "all-updates": _llr(problem.sampler, size, q, z / unit, s2, 0.0),
        }

    return observe


def _unit(problem: TrainingProblem, prep: Prepared) -> float:
    """The step's move along the canary's direction for the lone canary's gradient at the start."""
    g = jax.grad(example_loss, argnums=2)(
        prep.loss, prep.graphdef, prep.params, prep.x[prep.slot], prep.y[prep.slot]
    )
    cap = problem.sampler.capacity(problem.examples)
    return lone_response(problem.step_for(problem.examples), prep.params, prep.direction, g, cap)


def curve_runs(
    key: jax.Array, problem: TrainingProblem, n: int, *, canary: bool = True,
    prep: Prepared | None = None, max_params: int = 1024, devices=None, progress=None,
) -> tuple[dict[str, np.ndarray], str]:  # fmt: skip
    """N runs on D (or D') and what each adversary of the curve sees of each (numpy, ``[n, ...]``).

    Returns:
      ``({'loss', 'params', 'white-box', 'all-updates'} -> arrays, the parameters' description)``.

    """
    from cbdp_jax._src.infra.sharded_runs import sharded_runs

    check_key(key)
    n = check_int_at_least("runs", n, 1)
    if problem.canary.kind != "input":
        raise InvalidParameterError(
            "canary is invalid for the class curve: it needs an input canary (threat 'black-box' "
            "or 'white-box'), whose final loss a black-box adversary can read"
        )
    if problem.step_per_data_set:
        raise InvalidParameterError(
            "step is invalid for the class curve: a step built per data set (D and D' of "
            "different sizes) runs two programs; give one step"
        )
    prep = prepare(problem) if prep is None else prep
    keep, described = _sketch(prep, max_params)

    def build():
        observe = _observer(problem, prep, keep, _unit(problem, prep))
        return make_run(problem, prep, observe=observe), {}

    run, programs = remembered(_RUNS, (problem, prep), max_params, build, keep=2)
    out = sharded_runs(
        run, key, n, np.float32(canary), devices=devices, max_chunk=problem.chunk,
        progress=progress, programs=programs,
    )  # fmt: skip
    bad = int(np.sum(~out.finite))
    if bad:
        raise InvalidParameterError(
            f"training {problem.name!r} is refused: {bad} of {n} runs ended with NaN or inf "
            "parameters or scores"
        )
    return {k: np.asarray(v, np.float64) for k, v in out.extra.items()}, described


_RUNS: dict[tuple, tuple[tuple, Any]] = {}


def _certify(key, name: str, xp, xq, claim, base) -> tuple[float, float, int]:
    """One class's empirical eps and GDP mu on the samples (its own Bonferroni family)."""
    import dataclasses

    from cbdp_jax._src.mechanism_auditor.certify import _hockey_rows
    from cbdp_jax._src.mechanism_auditor.epsilon import empirical_epsilon

    if name in _CLASSES:
        config = dataclasses.replace(base, classes=_CLASSES[name], tail_bounds=name == "linear")
    else:
        config = dataclasses.replace(base, classes=("halfspace", "histogram"), tail_bounds=True)
    xp, xq = (np.asarray(a, np.float64).reshape(len(a), -1) for a in (xp, xq))
    rows, family = _hockey_rows(key, xp, xq, claim, config)
    emp = empirical_epsilon(rows, claim.delta, config.confidence)
    return emp.epsilon, emp.gdp_mu, family


def class_curve(
    key: jax.Array, problem: TrainingProblem, *, runs: int, claim: str | None = None,
    delta: float = 1e-5, confidence: float = 0.95, adversaries=ADVERSARIES,
    max_params: int = 1024, devices=None, progress=None,
) -> ClassCurve:  # fmt: skip
    """The empirical eps (and GDP mu) certified by each adversary class on the same runs.

    Args:
      key: A typed PRNG key (split into D's runs, D''s runs and the critics').
      problem: A :class:`TrainingProblem` with an input canary.
      runs: Runs per side.
      claim: The claim the grid and delta come from (default the run's own ``dpsgd:`` claim).
      delta: The default claim's delta.
      confidence: Each class's family-wise level.
      adversaries: Which of ``ADVERSARIES``, in the curve's order.
      max_params: The most final parameters the parameter critics see (module docstring).
      devices: The devices the runs are sharded over.
      progress: The runs' block hook (:class:`~cbdp_jax._src.infra.sharded_runs.Progress`), per side.

    Returns:
      :class:`ClassCurve`.

    """
    from cbdp_jax._src.mechanism_auditor.claims import parse_claim
    from cbdp_jax._src.training_auditor.audit_training import default_claim, training_audit_config

    check_key(key)
    for a in adversaries:
        if a not in ADVERSARIES:
            raise InvalidParameterError(
                f"adversaries={a!r} is invalid: each must be one of {list(ADVERSARIES)}"
            )
    text = default_claim(problem, delta) if claim is None else claim
    parsed = parse_claim(text)
    prep = prepare(problem)
    k_p, k_q, k_fit = jax.random.split(key, 3)
    t0 = time.perf_counter()
    common = dict(prep=prep, max_params=max_params, devices=devices, progress=progress)
    seen_p, described = curve_runs(k_p, problem, runs, canary=True, **common)
    seen_q, _ = curve_runs(k_q, problem, runs, canary=False, **common)
    run_seconds = time.perf_counter() - t0
    base = training_audit_config(parsed.epsilon, samples=runs, confidence=confidence)
    points = []
    for i, name in enumerate(adversaries):
        field = "params" if name in _CLASSES else name
        t1 = time.perf_counter()
        eps, mu, family = _certify(
            jax.random.fold_in(k_fit, i), name, seen_p[field], seen_q[field], parsed, base
        )
        label = LABELS[name] + (f" ({described})" if name in _CLASSES else "")
        dim = int(np.prod(seen_p[field].shape[1:])) if seen_p[field].ndim > 1 else 1
        points.append(CurvePoint(name, label, dim, eps, mu, family, time.perf_counter() - t1))
    return ClassCurve(
        tuple(points), text, parsed.epsilon, parsed.delta, confidence, runs, run_seconds
    )
