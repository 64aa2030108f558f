"""Audit the training you actually run, in one run: canaries inserted, the model trained once, bounds.

:func:`one_run_training` takes a :class:`~cbdp_jax._src.training_auditor.problem.TrainingProblem` (the user's
model, data, loss, DP step and sampler), inserts m canaries each with an independent coin, trains
ONCE with the problem's own step and sampler (:mod:`~cbdp_jax._src.training_auditor.one_run.engine`), scores every
canary and reports each one-run method of :mod:`~cbdp_jax._src.mechanism_auditor.one_run` on the scores, beside the
accountant's eps and the price of the audit (the model's loss and accuracy with and without the
canaries, trained on the same batches' key and noise), and the many-run audit's noise probes on the
step (:func:`probe_defects`: a failed probe is a ``Defect`` and the verdict is then never a plain
pass). :func:`one_run_repeats` runs R independent
audits vmapped in one program, sharded over devices (a soundness study).

Which score each method gets: ``'steinke'``, ``'fdp'`` and ``'gdp'`` (finite-sample, valid for any
mechanism and any score) get the ``'llr'`` score when it was asked for and exists (coordinate
gradient canaries), else the sum; ``'gaussian-scores'`` (asymptotic, under a Gaussian model of the
scores) always gets the sum, which is a Binomial mixture of Gaussians close to Gaussian, where the
likelihood ratio is skewed and its normality check refuses it.

Besides that score, every method is applied to the scores of the other critics of the family
(:mod:`~cbdp_jax._src.training_auditor.one_run.critics`: by default the largest step-to-step change
of each coordinate canary's update, which certifies a step that reuses its noise), each critic at
level 1 - beta / K (Bonferroni); each bound names the critic that gave it.

References:
  Steinke, Nasr, Jagielski 2023, "Privacy auditing with one (1) training run", NeurIPS 2023.
  Mahloujifar, Melis, Chaudhuri 2024, "Auditing f-differential privacy in one run".
  Agrawal et al. 2026, "Let's Ask Gauss: improved one-run privacy auditing".

"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cbdp_jax._src.infra.sharded_runs import sharded_runs
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_key,
)
from cbdp_jax._src.mechanism_auditor.loading import AuditRefusedError
from cbdp_jax._src.mechanism_auditor.one_run import one_run_audit
from cbdp_jax._src.privacy.accounting import dpsgd_epsilon
from cbdp_jax._src.training_auditor.noise_probes import noise_defects, verdict_with_defects
from cbdp_jax._src.training_auditor.one_run.canaries import gradient_canaries, input_canaries
from cbdp_jax._src.training_auditor.one_run.critics import family_bounds, resolve_critics
from cbdp_jax._src.training_auditor.one_run.engine import (
    Layout,
    RunOut,
    canary_unit,
    make_one_run,
    step_for_run,
)
from cbdp_jax._src.training_auditor.ops import Prepared, raw_key_leaves
from cbdp_jax._src.training_auditor.problem import TrainingProblem, cross_entropy

KINDS = ("gradient", "input")
SCORES = ("sum", "llr")
FINITE_SAMPLE = ("steinke", "fdp", "gdp")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OneRunTrainingResult:
    """One one-run audit of a training.

    Attributes:
      kind: ``'gradient'`` (every update seen) or ``'input'`` (black-box: the final model only).
      canaries: m.
      included: How many coins came up "in".
      directions: ``'coordinate'`` or ``'dense'`` (gradient canaries), ``'ood'`` / ``'mislabel'``.
      bounds: Method -> its best bound over the critics: the fields of ``OneRunBound._asdict()``
        (``level`` there is the critic's, 1 - beta / K) plus ``score`` (which score it got),
        ``critic`` (the critic that gave it), ``family`` (K) and ``kind`` (finite-sample or
        asymptotic); a method every critic refused has ``epsilon`` None and ``refused`` (the
        reasons).
      claim_epsilon: The accountant's eps at ``delta`` (None without the problem's noise).
      delta: The delta of every bound and of the claim.
      level: 1 - beta of each bound, family-wise over the critics.
      violation: Some finite-sample bound exceeds ``claim_epsilon``: the claim is refuted.
      asymptotic_violation: Only ``'gaussian-scores'`` (asymptotic) exceeds it.
      reach: The largest eps a finite-sample method can certify with m canaries (every guess right),
        at the critic's level 1 - beta / K.
      verdict: The audit in one line.
      loss_with: The trained model's mean loss (evaluation data) with the canaries.
      loss_without: The same training (same batches' key and noise) without any canary.
      accuracy_with: Its accuracy (nan for a user's loss).
      accuracy_without: Without the canaries.
      hit_rate: The share of (included canary, step) pairs whose batch held it (q for Poisson).
      noise_ratio: Excluded sum scores' spread over the noise's alone, S sqrt(T) (gradient canaries,
        S known; 1 means no interference).
      step_size: The data set size a step factory was given (n + m // 2), None for a fixed step.
      examples: n, the problem's examples.
      steps: T.
      sampling_rate: The q the accountant is told.
      seconds: Wall time of the run(s) and the bounds.
      scores: ``[m]`` the sum scores (or loss drops); not in ``to_dict`` unless asked.
      coins: ``[m]`` bool, the coins.
      llr: ``[m]`` the likelihood-ratio scores (``score='llr'`` with coordinate canaries), else None.
      defects: What the step's noise does that the accountant does not assume (:class:`Defect`
        tuples from :mod:`~cbdp_jax._src.training_auditor.noise_probes`, probed before the run; empty: none found).
      critics: The family of critics, in order (:mod:`~cbdp_jax._src.training_auditor.one_run.critics`).
      critic_bounds: Critic -> method -> its eps at level 1 - beta / K (None where refused).

    """

    kind: str
    canaries: int
    included: int
    directions: str
    bounds: dict
    claim_epsilon: float | None
    delta: float
    level: float
    violation: bool
    asymptotic_violation: bool
    reach: float
    verdict: str
    loss_with: float
    loss_without: float
    accuracy_with: float
    accuracy_without: float
    hit_rate: float
    noise_ratio: float
    step_size: int | None
    examples: int
    steps: int
    sampling_rate: float
    seconds: float = 0.0
    scores: Any = None
    coins: Any = None
    llr: Any = None
    defects: tuple = ()
    critics: tuple = ("score",)
    critic_bounds: dict = dataclasses.field(default_factory=dict)

    def to_dict(self, *, arrays: bool = False) -> dict:
        """Plain JSON-ready fields (the score and coin arrays only with ``arrays``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["defects"] = [d._asdict() for d in self.defects]
        out["critics"] = list(self.critics)
        if arrays:
            out["scores"] = np.asarray(self.scores, float).tolist()
            out["coins"] = np.asarray(self.coins, bool).tolist()
            out["llr"] = None if self.llr is None else np.asarray(self.llr, float).tolist()
        else:
            out.pop("scores"), out.pop("coins"), out.pop("llr")
        return out

    def best(self, methods=FINITE_SAMPLE) -> tuple[str, float]:
        """The largest bound among ``methods`` (finite-sample by default) and its method."""
        got = [(b["epsilon"] or 0.0, k) for k, b in self.bounds.items() if k in methods]
        eps, name = max(got) if got else (0.0, "")
        return name, eps

    def certified_by(self, methods=FINITE_SAMPLE) -> str | None:
        """The critic that gave the largest bound among ``methods`` (None if every one refused)."""
        name, _ = self.best(methods)
        return self.bounds[name].get("critic") if name else None


def _layout(key, problem: TrainingProblem, m: int, kind: str, directions: str,
            input_kind: str, eval_data) -> Layout:  # fmt: skip
    """Splits the model, draws the canaries (from their own key), builds the step and its unit."""
    graphdef, params = nnx.split(problem.model, nnx.Param)
    loss = cross_entropy if problem.loss_fn is None else problem.loss_fn
    x = jnp.asarray(problem.data[0], jnp.float32)
    y_np = np.asarray(problem.data[1])
    classify = problem.loss_fn is None
    y = jnp.asarray(y_np, jnp.int32 if classify or np.issubdtype(y_np.dtype, np.integer) else None)
    n = x.shape[0]
    problem.sampler.check_size(n + m, what=f"the {n} examples and {m} canary slots")
    tx, step_size = step_for_run(problem, n, m)
    if kind == "gradient":
        norm = problem.canary_norm()
        cs = gradient_canaries(key, loss, graphdef, params, x, y, m, norm=norm,
                               directions=directions)  # fmt: skip
        unit = canary_unit(tx, params, cs, problem.sampler.capacity(n + m))
    else:
        if not classify:
            raise InvalidParameterError(
                "kind='input' is invalid with a user's loss_fn: input canaries are mislabelled or "
                "out-of-distribution classification examples; use kind='gradient'"
            )
        classes = int(jax.eval_shape(lambda a: nnx.merge(graphdef, params)(a), x[:1]).shape[-1])
        cs, unit = input_canaries(key, np.asarray(x), y_np, m, classes, kind=input_kind), 1.0
    ex, ey = (x, y) if eval_data is None else (jnp.asarray(a) for a in eval_data)
    layout = Layout(graphdef, params, x, y, cs, tx, step_size, unit, loss, classify, ex, ey)
    if kind == "input":
        init = jax.vmap(lambda a, b: layout.loss(nnx.merge(graphdef, params), a[None], b[None]))
        layout = layout._replace(init_canary_loss=init(cs.x, cs.y).reshape(-1))
    return layout


def claim_epsilon(problem: TrainingProblem, rate: float, delta: float) -> float | None:
    """The accountant's eps at ``delta``: Poisson-subsampled Gaussian, add/remove (None without S)."""
    if problem.noise_multiplier is None:
        return None
    return dpsgd_epsilon(problem.noise_multiplier, rate, problem.steps, delta)


@functools.lru_cache(maxsize=16)
def reach(m: int, delta: float, level: float) -> float:
    """The largest eps ``'steinke'`` or ``'fdp'`` certifies with m canaries when every guess is right."""
    included = np.arange(m) % 2 == 0
    scores = included.astype(float)
    return max(
        one_run_audit(scores, included, delta=delta, level=level, method=k).epsilon
        for k in ("steinke", "fdp")
    )


def _verdict(res: dict) -> tuple[bool, bool, str]:
    eps_claim, bounds, top = res["claim_epsilon"], res["bounds"], res["reach"]
    fin = max((bounds[k]["epsilon"] or 0.0, k) for k in FINITE_SAMPLE)
    by = f"{fin[1]}, {bounds[fin[1]].get('critic')} critic"
    asym = bounds["gaussian-scores"]["epsilon"]
    if eps_claim is None:
        return (
            False,
            False,
            f"no claim to check (no noise multiplier); best finite-sample eps {fin[0]:.3g} ({fin[1]})",
        )
    if fin[0] > eps_claim:
        return (
            True,
            False,
            (
                f"VIOLATION: {by} certifies eps >= {fin[0]:.3g} at delta {res['delta']:g} "
                f"(finite-sample, level {res['level']:g} over {len(res['critics'])} critic(s)); "
                f"the accountant claims {eps_claim:.3g}"
            ),
        )
    asym_v = asym is not None and asym > eps_claim
    text = f"no violation certified: best finite-sample eps {fin[0]:.3g} ({fin[1]}) <= claim {eps_claim:.3g}"
    if asym_v:
        text += f"; gaussian-scores (asymptotic, assumes Gaussian scores) gives {asym:.3g} > claim"
    if eps_claim >= top:
        text += (
            f"; m = {res['canaries']} canaries cannot certify more than eps {top:.3g} in one run "
            "(every guess right), so this claim cannot be refuted here: the pass says nothing"
        )
    return False, asym_v, text


def _check(problem, canaries, kind, score, delta, level, directions, input_kind, critics) -> str:
    if not isinstance(problem, TrainingProblem):
        raise InvalidParameterError("problem is invalid: must be a TrainingProblem")
    check_int_at_least("canaries", canaries, 2)
    kind = kind or ("gradient" if problem.threat == "gradient" else "input")
    check_choice("kind", kind, KINDS)
    check_choice("score", score, SCORES)
    check_in_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    check_in_range("level", level, 0.0, 1.0, low_open=True, high_open=True)
    check_choice("directions", directions, ("auto", "coordinate", "dense"))
    check_choice("input_canaries", input_kind, ("ood", "mislabel"))
    resolve_critics(critics, has_steps=True)  # the names; whether the canaries allow them: later
    if score == "llr" and (kind != "gradient" or problem.noise_multiplier is None):
        raise InvalidParameterError(
            "score='llr' is invalid here: it needs gradient canaries and the problem's "
            "noise_multiplier; use score='sum'"
        )
    return kind


def _mesh(devices):
    """A 1-D mesh over ``devices`` (axis ``'batch'``), or None for one device."""
    if devices is None or len(devices) < 2:
        return None
    return jax.sharding.Mesh(np.asarray(devices), ("batch",))


def _setup(key, problem, canaries, kind, score, delta, level, directions, input_kind, eval_data,
           critics, mesh=None):  # fmt: skip
    kind = _check(problem, canaries, kind, score, delta, level, directions, input_kind, critics)
    k_canary, k_run = jax.random.split(check_key(key))
    layout = _layout(k_canary, problem, canaries, kind, directions, input_kind, eval_data)
    coordinate = kind == "gradient" and layout.canaries.directions == "coordinate"
    family = resolve_critics(critics, has_steps=coordinate)
    n = layout.x.shape[0]
    rate = problem.sampler.sampling_rate(layout.step_size or n + canaries // 2)
    steps = any(c != "score" for c in family)
    run = make_one_run(problem, layout, llr=score == "llr", steps=steps,
                       noise_multiplier=problem.noise_multiplier, rate=rate, mesh=mesh)  # fmt: skip
    return kind, layout, rate, run, k_run, family


def _result(out: RunOut, base, layout: Layout, problem, rate, kind, score, delta, level,
            claim, seconds, family) -> OneRunTrainingResult:  # fmt: skip
    """One run's outputs (numpy, no leading axis) and the comparison run's as a result."""
    if not bool(out.finite):
        raise AuditRefusedError(
            "the one-run training produced NaN or inf parameters or scores: the audit is refused "
            "(never a pass); lower the learning rate or check the step"
        )
    cs, coins = layout.canaries, np.asarray(out.included, bool)
    use_llr = score == "llr" and cs.directions == "coordinate"
    bounds, by_critic = family_bounds(out, coins, family, delta=delta, level=level,
                                      use_llr=use_llr)  # fmt: skip
    ratio = math.nan
    if kind == "gradient" and problem.noise_multiplier is not None and (~coins).sum() > 1:
        ideal = problem.noise_multiplier * math.sqrt(problem.steps)
        ratio = float(np.std(np.asarray(out.scores)[~coins], ddof=1) / ideal)
    hits = np.asarray(out.hits)[coins]
    fields = dict(
        kind=kind, canaries=cs.m, included=int(coins.sum()),
        directions=cs.directions if kind == "gradient" else "input",
        bounds=bounds, claim_epsilon=claim, delta=float(delta), level=float(level),
        reach=reach(cs.m, delta, 1.0 - (1.0 - level) / len(family)), critics=tuple(family),
    )  # fmt: skip
    violation, asym, verdict = _verdict(fields)
    return OneRunTrainingResult(
        **fields, violation=violation, asymptotic_violation=asym, verdict=verdict,
        loss_with=float(out.loss), accuracy_with=float(out.accuracy),
        loss_without=float(base.loss) if base is not None else math.nan,
        accuracy_without=float(base.accuracy) if base is not None else math.nan,
        hit_rate=float(hits.sum() / max(hits.size * problem.steps, 1)), noise_ratio=ratio,
        step_size=layout.step_size, examples=int(layout.x.shape[0]), steps=problem.steps,
        sampling_rate=float(rate), seconds=float(seconds), scores=np.asarray(out.scores),
        coins=coins, llr=np.asarray(out.llr) if use_llr else None, critic_bounds=by_critic,
    )  # fmt: skip


def probe_defects(problem: TrainingProblem, layout: Layout) -> tuple:
    """The noise probes of the many-run audit on the one run's step (:func:`noise_defects`).

    The probes run the step the run uses (a factory's, built for n + m // 2 examples) on zero
    gradients under their own fixed key, before and apart from the run: they see the step, never
    the coins. A failed probe is a :class:`Defect`: the accountant does not describe the step.
    """
    cap = problem.sampler.capacity(problem.examples)
    raw = raw_key_leaves(layout.tx, layout.params, cap)
    prep = Prepared(layout.graphdef, layout.params, layout.x, layout.y, 0, None, None, 1.0, -1,
                    False, loss=layout.loss, raw_keys=raw)  # fmt: skip
    return noise_defects(jax.random.key(0), problem, layout.tx, prep)


def with_defects(result: OneRunTrainingResult, defects: tuple) -> OneRunTrainingResult:
    """``result`` with its defects; a verdict without a certified violation says they exist."""
    verdict = verdict_with_defects(result.verdict, result.violation, defects)
    return dataclasses.replace(result, defects=tuple(defects), verdict=verdict)


def one_run_training(
    key: jax.Array, problem: TrainingProblem, *, canaries: int = 1000, kind: str | None = None,
    directions: str = "auto", score: str = "sum", delta: float = 1e-5, level: float = 0.95,
    input_canaries: str = "ood", eval_data=None, compare: bool = True,
    claim: float | None = None, devices=None, noise_probes: bool = True, critics="auto",
) -> OneRunTrainingResult:  # fmt: skip
    """Inserts m canaries into ``problem``'s training, trains ONCE, and bounds eps from their scores.

    Args:
      key: A typed PRNG key: split into the canaries' key (directions or input examples) and the
        run's key, itself split into the coins', the batches' and the noise's keys (so the coins
        are independent of everything else). Same key, same result.
      problem: The :class:`TrainingProblem`: its model, data, loss, step (a factory is given
        n + m // 2 examples), sampler (over n + m slots, the excluded canaries absent), steps,
        noise multiplier (for the accountant's claim) and clipping norm (the canaries' norm is
        ``problem.canary_norm()``, 4 C by default). Its own canary and threat are not used.
      canaries: m >= 2, each in the training independently with probability 1/2.
      kind: ``'gradient'`` (fixed per-example gradients; every update seen) or ``'input'``
        (black-box: mislabelled or out-of-distribution examples scored by the final model's loss);
        default from ``problem.threat``.
      directions: Gradient canaries: ``'coordinate'`` (coordinates no example moves), ``'dense'``
        (random unit vectors regenerated from keys) or ``'auto'`` (coordinates if the model has m).
      score: ``'sum'`` or ``'llr'`` (finite-sample methods get the likelihood ratio; coordinate
        canaries and a known noise multiplier only).
      delta: The delta of the bounds and of the accountant's claim, in (0, 1).
      level: 1 - beta of each bound, in (0, 1).
      input_canaries: ``'ood'`` or ``'mislabel'`` (``kind='input'``).
      eval_data: ``(X, y)`` to evaluate the model's loss and accuracy on (default the training data).
      compare: Also train without any canary (same batches' key and noise): the price of the audit.
      claim: The eps claimed at ``delta`` (default the accountant's: Poisson-subsampled Gaussian,
        add/remove, at the problem's noise multiplier, q and steps; None without them).
      devices: Split each step's batch over these devices (data parallel; default every local
        device, one device: no split). The result is the same up to float rounding.
      noise_probes: Probe the step's noise before the run, as the many-run audit does
        (:func:`probe_defects`); a failed probe is in ``defects`` and in the verdict. False
        leaves ``defects`` empty (unchecked, not clean).
      critics: The family of critics every method is applied to, each at level 1 - beta / K:
        ``'auto'`` (``('score', 'steps-max')`` for coordinate gradient canaries, else
        ``('score',)``) or distinct names among ``'score'``, ``'steps-max'``, ``'steps-sq'``
        (:mod:`~cbdp_jax._src.training_auditor.one_run.critics`).

    Returns:
      A :class:`OneRunTrainingResult`.

    Raises:
      InvalidParameterError: Naming the parameter and its range.
      AuditRefusedError: When the run's parameters or scores are not finite.

    """
    start = time.perf_counter()
    mesh = _mesh(jax.local_devices() if devices is None else list(devices))
    kind, layout, rate, run, k_run, family = _setup(
        key, problem, canaries, kind, score, delta, level, directions, input_canaries, eval_data,
        critics, mesh,
    )  # fmt: skip
    program = jax.jit(run)
    out = jax.tree.map(np.asarray, program(k_run, jnp.float32(1.0)))
    base = jax.tree.map(np.asarray, program(k_run, jnp.float32(0.0))) if compare else None
    if claim is None:
        claim = claim_epsilon(problem, rate, delta)
    defects = probe_defects(problem, layout) if noise_probes else ()
    result = _result(out, base, layout, problem, rate, kind, score, delta, level, claim,
                     time.perf_counter() - start, family)  # fmt: skip
    return with_defects(result, defects)


def one_run_repeats(
    key: jax.Array, problem: TrainingProblem, repeats: int, *, canaries: int = 1000,
    kind: str | None = None, directions: str = "auto", score: str = "sum", delta: float = 1e-5,
    level: float = 0.95, input_canaries: str = "ood", devices=None, chunk: int = 64,
    critics="auto",
) -> list[OneRunTrainingResult]:  # fmt: skip
    """R independent one-run audits (soundness studies), vmapped in one program, sharded over devices.

    The canaries (directions or input examples) are drawn once from ``key``'s first half; audit r
    draws its coins, batches and noise from key r of ``jax.random.split(second half, R)``
    (:func:`~cbdp_jax._src.infra.sharded_runs.sharded_runs`: the same keys whatever the devices). No
    comparison run (``loss_without`` is nan). Arguments as :func:`one_run_training`; ``chunk`` is
    the most audits vmapped per device per call (memory: chunk trainings at once).
    """
    start = time.perf_counter()
    check_int_at_least("repeats", repeats, 1)
    kind, layout, rate, run, k_run, family = _setup(
        key, problem, canaries, kind, score, delta, level, directions, input_canaries, None,
        critics,
    )  # fmt: skip
    outs = sharded_runs(run, k_run, repeats, np.float32(1.0), devices=devices, max_chunk=chunk)
    claim = claim_epsilon(problem, rate, delta)
    seconds = (time.perf_counter() - start) / repeats
    return [
        _result(
            jax.tree.map(lambda a, i=i: a[i], outs),
            None,
            layout,
            problem,
            rate,
            kind,
            score,
            delta,
            level,
            claim,
            seconds,
            family,
        )  # fmt: skip
        for i in range(repeats)
    ]
