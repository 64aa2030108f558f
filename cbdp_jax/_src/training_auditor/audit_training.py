"""DP training runs as a mechanism, audited under the neighbouring relation of the claim.

A training run is the mechanism (:mod:`~cbdp_jax._src.training_auditor.problem` says what one is,
:mod:`~cbdp_jax._src.training_auditor.runs` runs many of them in one compiled program). Runs on D (the
canary in) and on its neighbour D' under the audited relation give one score each, and the scores are
audited by :func:`cbdp_jax.audit.audit` with the pair D = [1], D' = [0], so the hockey-stick rows,
the empirical epsilon and the verdict are the audit's own. Three rules make a clean bill earned:

* the claim is accounted under the relation audited (a ``dpsgd:`` claim names its relation, default
  add-remove as in dp_accounting; a problem's ``relation`` re-accounts a claim that names none, and
  contradicting one is refused);
* a run whose parameters or score are NaN or inf refuses the audit, naming the share of runs;
* what the audit cannot see by construction is named on the result (``blind_spots``);
* what the step does that the accountant does not assume (its noise reused across steps, shared
  across coordinates, missing at a step, or smaller than claimed) is named on the result
  (``defects``, :mod:`~cbdp_jax._src.training_auditor.noise_probes`), and an audit that names one never reads as a
  plain "no violation".

References:
  Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis 2023, "Tight auditing of
  differentially private machine learning"; Jagielski, Ullman, Oprea 2020, "Auditing differentially
  private machine learning"; Abadi et al. 2016.

"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from cbdp_jax._src.infra.memo import remembered
from cbdp_jax._src.infra.validation import InvalidParameterError, check_key
from cbdp_jax._src.mechanism_auditor.loading import AuditMechanism, AuditRefusedError
from cbdp_jax._src.training_auditor.critics import release_groups
from cbdp_jax._src.training_auditor.dp_steps import BUGS, DpSgdState, dp_sgd
from cbdp_jax._src.training_auditor.noise_probes import verdict_with_defects
from cbdp_jax._src.training_auditor.ops import Prepared
from cbdp_jax._src.training_auditor.prepare import prepare
from cbdp_jax._src.training_auditor.problem import (
    SCORES,
    THREATS,
    Canary,
    TrainingProblem,
    load_problem,
)
from cbdp_jax._src.training_auditor.release import ReleaseLayout, release_layout
from cbdp_jax._src.training_auditor.runs import (
    RunOutput,
    make_run,
    many_runs,
    training_runs,
)

__all__ = [
    "BUGS",
    "SCORES",
    "THREATS",
    "Canary",
    "DpSgdState",
    "Prepared",
    "RunOutput",
    "TrainingMechanism",
    "TrainingProblem",
    "audit_training",
    "default_claim",
    "dp_sgd",
    "load_problem",
    "make_run",
    "prepare",
    "training_audit_config",
    "training_mechanism",
    "training_runs",
]

_SIDES = {1.0: "D (canary in)", 0.0: "D' (the neighbour)"}


def training_mechanism(
    problem: TrainingProblem, prep: Prepared | None = None, *, release: bool = True
) -> AuditMechanism:
    """The training as an :class:`~cbdp_jax.audit.AuditMechanism`: ``fn(key, dataset, n)`` runs n trainings.

    ``dataset`` is ``[1.0]`` (D: canary in) or ``[0.0]`` (D': the relation's neighbour); ``fn``
    traces under ``jax.jit`` with n static. Its outputs are the n scores ``[n]``. ``sample`` runs
    them in the programs :func:`training_runs` keeps, refuses runs that are not finite and returns
    each run's score and release (:mod:`~cbdp_jax._src.training_auditor.release`); ``release=False``
    records the score alone (one value a run, for the audit of ``feature_groups=('score',)``).
    """
    prep = prepare(problem) if prep is None else prep
    runs = {}

    def fn(key, dataset, n):
        present = _present(dataset)
        if problem.step_per_data_set:  # a step per data set: the side must be known when tracing
            side = float(present)
            if side not in runs:
                runs[side] = make_run(problem, prep, side=side)
            return many_runs(problem, runs[side], key, present, n).score
        if None not in runs:
            runs[None] = make_run(problem, prep)
        return many_runs(problem, runs[None], key, present, n).score

    layout = release_layout(problem, prep) if release else None
    return TrainingMechanism(fn, problem.name, problem=problem, prep=prep, release=layout)


def _present(dataset) -> Any:
    """The first entry of ``[present]`` as float32 (1.0 on D, 0.0 on D')."""
    import jax.numpy as jnp

    return jnp.asarray(dataset, jnp.float32).reshape(-1)[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingMechanism(AuditMechanism):
    """An :class:`~cbdp_jax.audit.AuditMechanism` whose samples come from :func:`training_runs`.

    ``sample`` runs the trainings in the compiled program :func:`training_runs` keeps per run count,
    so an audit's D and D' samples, and any other call with the same count, share one compilation;
    it refuses (:class:`~cbdp_jax.audit.AuditRefusedError`) when any run's parameters, score or
    release are NaN or inf. A sample row is ``[score, release...]``: the threat's score, then what
    the threat releases (``release``, a :class:`ReleaseLayout`; None records nothing more), which
    ``feature_groups`` splits into the groups the audit certifies
    (:mod:`~cbdp_jax._src.training_auditor.critics`).
    """

    problem: TrainingProblem
    prep: Prepared
    sample_noun: str = "runs"
    devices: Any = None
    progress: Any = None
    release: ReleaseLayout | None = None

    @property
    def feature_groups(self) -> tuple:
        """The :class:`~cbdp_jax._src.mechanism_auditor.hockey_stick.FeatureGroup` tuple of the samples (score first)."""
        if self.release is None:
            return ()
        kind = self.problem.score_kind() if self.problem.threat == "gradient" else None
        return release_groups(self.release, kind)

    def output_dim(self, dataset: Any) -> int:
        """Values per run: the score and the release's T k (nothing is traced)."""
        del dataset
        if self.release is None or self.release.kind == "none":
            return 1
        return 1 + self.release.steps * self.release.width

    checkpoint: Any = None

    def sample(self, key: jax.Array, dataset: Any, n: int) -> np.ndarray:
        """N runs on D (``dataset = [1]``) or D' (``[0]``): ``[n, 1 + rows k]``, score first.

        float32 (the values as recorded); float64 ``[n, 1]`` without a release.
        ``progress`` (if set) hears the runs of both sides as one count of 2n: D's, then D''s.
        """
        present = float(np.asarray(dataset, np.float64).reshape(-1)[0])
        out = training_runs(
            key, self.problem, n, canary=present, prep=self.prep, devices=self.devices,
            progress=_both_sides(self.progress, n, present), release=self.release,
            blocks=_part(self.checkpoint, key, present, n),
        )  # fmt: skip
        bad = int(np.sum(~out.finite))
        if bad:
            raise AuditRefusedError(
                f"training {self.name!r} is refused: {bad} of {n} runs ({100.0 * bad / n:.3g}%) "
                f"on {_SIDES[present]} ended with NaN or inf parameters or scores; an audit "
                "certifies nothing about runs it could not check (lower the learning rate, or check "
                "the data and the loss)"
            )
        if self.release is None or self.release.kind == "none":
            return np.asarray(out.score, np.float64)[:, None]
        # float32 throughout (the values as recorded): n x (1 + T k) numbers per side
        release = np.asarray(out.release, np.float32).reshape(n, -1)
        return np.concatenate([np.asarray(out.score, np.float32)[:, None], release], axis=1)


def _part(checkpoint, key: jax.Array, present: float, n: int):
    """The checkpoint's blocks of one call (named by its key, side and n), or None."""
    if checkpoint is None:
        return None
    words = np.asarray(jax.random.key_data(key)).tolist()
    return checkpoint.part(f"key={words} present={present!r} n={n}")


def _both_sides(progress, n: int, present: float):
    """A block hook for one side that reports to ``progress`` the count of both (D first)."""
    if progress is None:
        return None
    offset = 0 if present else n

    def hook(p):
        rate = p.done / max(p.seconds, 1e-9)
        later = n / rate if present and rate > 0 else 0.0  # D' still to come
        progress(p._replace(done=p.done + offset, total=2 * n, eta=p.eta + later))

    return hook


def default_claim(problem: TrainingProblem, delta: float = 1e-5) -> str:
    """The run's own statement: ``dpsgd:noise=S,rate=q,steps=T,delta=D,sampling=KIND,relation=R``.

    The relation is the problem's (add-remove, dp_accounting's default, when it names none).
    """
    if problem.noise_multiplier is None:
        raise InvalidParameterError(
            "claim=None is invalid: give a claim, or the run's noise_multiplier to build its dpsgd claim"
        )
    return (
        f"dpsgd:noise={problem.noise_multiplier:g},rate={problem.sampling_rate:.10g},"
        f"steps={problem.steps},delta={delta:g},sampling={problem.sampler.accounted_as},"
        f"relation={problem.audited_relation}"
    )


def eps_grid_for(epsilon: float) -> tuple[float, ...]:
    """Grid multiples of the claimed eps: eps' in {0.25, 0.5, 1, 2, 4, 8} below it, and eps itself.

    A ``dpsgd:`` claim is the accountant's whole curve, so points well below the claimed eps are
    claims in their own right (where a shuffled run's excess shows, docs/theory/training_audit.md).
    """
    if not epsilon > 0:
        return (1.0,)
    points = [e for e in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0) if e < 0.95 * epsilon]
    return tuple(e / epsilon for e in points) + (1.0,)


def training_audit_config(epsilon: float = 1.0, **overrides) -> Any:
    """The audit's budgets for 1-D scores: threshold and histogram critics, 10^4 runs per side.

    The grid is :func:`eps_grid_for` the claimed ``epsilon``; the critics are indicators, certified
    with exact binomial bounds as well, plus one tail set per direction for eps at the claim's delta
    (``tail_bounds``, docs/theory/training_audit.md section 8). Every feature group of the runs'
    release is certified in the same family (``feature_groups=None``; docs/theory/training_audit.md
    section 10; ``feature_groups=('score',)`` is the score alone, the audit of before);
    ``overrides`` replace any field.
    """
    from cbdp_jax._src.mechanism_auditor.config import AuditConfig

    base = dict(
        samples=10_000, classes=("halfspace", "histogram"), eps_grid=eps_grid_for(epsilon),
        screen_samples=100, tail_bounds=True,
    )  # fmt: skip
    return AuditConfig(**(base | overrides))


def _relation_of(problem: TrainingProblem, text: str, parsed) -> tuple[str, str]:
    """The relation audited and the claim accounted under it (the claim's text, re-accounted if needed).

    A ``dpsgd:`` claim names its relation or is accounted under add-remove (dp_accounting's
    default); a problem's explicit relation re-accounts a claim that names none and refuses one that
    names another. Other claims carry no accountant: the problem's relation, or add-remove.
    """
    source = parsed.source
    if source is None:
        return problem.audited_relation, text
    named = "relation=" in text
    if problem.relation is None or problem.relation == source.relation:
        return source.relation, text
    if named:
        raise InvalidParameterError(
            f"relation={problem.relation!r} is invalid with claim {text!r}: the claim is accounted "
            f"under {source.relation}; audit under the claim's relation or account the claim under "
            f"relation={problem.relation}"
        )
    return problem.relation, f"{text},relation={problem.relation}"


_MECHANISMS: dict[tuple, tuple[tuple, AuditMechanism]] = {}
_RELATED: dict[tuple, tuple[tuple, TrainingProblem]] = {}


def audit_training(
    key: jax.Array, problem: TrainingProblem, claim: str | None = None, *, delta: float = 1e-5,
    config: Any = None, devices=None, progress=None, checkpoint=None,
) -> Any:  # fmt: skip
    """Audits a DP training's claim from ``config.samples`` runs on D and as many on D'.

    Args:
      key: A typed PRNG key (the audit splits it for D's runs, D''s runs and the critics).
      problem: The :class:`TrainingProblem`.
      claim: ``pure:``, ``approx:`` or ``dpsgd:`` text; default :func:`default_claim`.
      delta: The default claim's delta.
      config: An :class:`~cbdp_jax.audit.AuditConfig` (default :func:`training_audit_config` at the
        claim's epsilon).
      devices: The devices the runs are sharded over (default every device of every process).
      progress: Called with a :class:`~cbdp_jax._src.infra.sharded_runs.Progress` (the runs of D and D'
        as one count) after each block of runs, about half a second apart.
      checkpoint: A :class:`~cbdp_jax._src.infra.run_blocks.RunBlocks` the runs' outputs are written
        into as they finish (and read back from when it resumes one), or None.

    Returns:
      The :class:`~cbdp_jax.audit.AuditResult` of :func:`cbdp_jax.audit.audit` on the pair
      ([1], [0]): certified rows, empirical epsilon, verdict, the violation's point, the relation
      audited, the blind spots and the defects.

    Raises:
      InvalidParameterError: For a claim that is not an (epsilon, delta) claim, cannot be accounted
        under the relation, or names another relation than the problem's.
      AuditRefusedError: When any run's parameters or score are NaN or inf.

    """
    from cbdp_jax._src.mechanism_auditor.audit import audit
    from cbdp_jax._src.mechanism_auditor.claims import parse_claim

    check_key(key)
    text = default_claim(problem, delta) if claim is None else claim
    parsed = parse_claim(text)
    if parsed.kind not in ("pure", "approx"):
        raise InvalidParameterError(
            f"claim={text!r} is invalid: a training audit checks pure:, approx: or dpsgd: claims"
        )
    relation, text = _relation_of(problem, text, parsed)
    parsed = parse_claim(text)
    runs = problem
    if relation != problem.audited_relation:
        build = lambda: dataclasses.replace(problem, relation=relation)
        runs = remembered(_RELATED, (problem,), relation, build, keep=4)
    # one problem's mechanism (and compiled program) kept: audits of it with other keys reuse it
    config = training_audit_config(parsed.epsilon) if config is None else config
    # the score alone records nothing more: one value a run (10^7 runs a side hold 0.3 GB, not 50)
    release = config.feature_groups != ("score",)
    build = lambda: training_mechanism(runs, release=release)
    mech = remembered(_MECHANISMS, (runs,), release, build, keep=2)
    if devices is not None or progress is not None or checkpoint is not None:
        mech = dataclasses.replace(mech, devices=devices, progress=progress, checkpoint=checkpoint)
    result = audit(key, mech, parsed, pair=([1.0], [0.0]), config=config)
    defects = mech.prep.defects
    verdict = verdict_with_defects(result.verdict, result.violation, defects)
    return dataclasses.replace(
        result, relation=relation, blind_spots=mech.prep.blind_spots, defects=defects,
        verdict=verdict,
    )  # fmt: skip
