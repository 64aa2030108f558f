"""Probes of a DP step's noise before training: does it meet what the accountant assumes.

The accountant of DP-SGD assumes that step t releases a post-processing of the noisy aggregate
A_t = sum_i clip(g_i) + Z_t, with Z_t ~ N(0, (S C)^2 I) drawn afresh: independent of everything
released before, of the other runs, and across coordinates, at every step, on every parameter.
Momentum, Adam, schedules and weight decay are post-processing (their updates are correlated
across steps by design) and are never named. :func:`noise_defects` runs the step on zero gradients
for the T steps of a run, under ``keys`` run keys (vmapped), carrying its state and applying its
updates as a run would, and at each step also applies the step from the SAME state with fresh keys
(the state's keys replaced, :func:`~cbdp_jax._src.training_auditor.ops.rekey`). Given the past, a correct
step's real update and a fresh-key update are independent draws of one law, whatever the
post-processing (docs/theory/training_audit.md, section 11). Named as :class:`Defect`:

* ``'noise-unchecked'`` (exact): the update of zero gradients is NaN or inf, nothing is probed;
* ``'noise-not-keyed'`` (exact): no update changes with the run's key: every run draws the same noise;
* ``'noise-missing'`` (exact): at some step the update does not change with the key, while it
  does change with the gradient (a step that moves with neither releases nothing);
* ``'noise-not-fresh'``: at some step the real update is closer to a past update (|cosine| less
  relative distance, at most 1: equal updates) than the fresh-key update is, in more runs than a fair coin allows (a sign test);
* ``'noise-dependent-coordinates'``: the difference of two fresh-key updates (coordinates that get
  no gradient in either) has signs that agree on two coordinates more often than a fair coin allows;
* ``'noise-too-small'``: the gradient is the ruler. A shift of +d and -d (d <= C, unclipped) on one
  coordinate per example slot, under two fresh keys, is ordered as the shifted noise is: for a
  coordinate-wise monotone post-processing the chance that the +d update lies beyond the -d one is
  at most Phi(sqrt(2) d / sigma), so a share above Phi(sqrt(2) d / (S C)) bounds the noise's std
  sigma below S C (per leaf over all steps, and per step over all leaves). No learning rate or
  divisor is needed: the step's response to the gradient calibrates itself at every step. It
  assumes independent coordinates, and is not run when they are named dependent.

Each test's p-value is a Hoeffding-Azuma bound; the family-wise level ``LEVEL`` (1e-6) is split in
equal thirds over the three statistical families and Bonferroni within each.

References:
  Abadi et al. 2016, "Deep learning with differential privacy"; Hoeffding 1963, "Probability
  inequalities for sums of bounded random variables"; Azuma 1967.

"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from scipy import stats

from cbdp_jax._src.infra.programs import quick_options
from cbdp_jax._src.mechanism_auditor.results import Defect
from cbdp_jax._src.training_auditor.ops import Prepared, apply_step, rekey_with
from cbdp_jax._src.training_auditor.problem import TrainingProblem

LEVEL = 1e-6  # family-wise: a correct step is named with probability at most this
KEYS = 64  # run keys probed (vmapped)
WATCHED = 2048  # coordinates the freshness test compares (all of a smaller model)
SHIFTED = 48  # coordinates shifted and paired (at most one per example slot)


class Probe(NamedTuple):
    """What the probe runs record ``[keys, T, ...]`` (``watched``: F coordinates, else M).

    Attributes:
      real: The run's own updates on the watched coordinates.
      fresh: The update from the same state with a fresh key a, watched coordinates.
      plus: The update with +d on the shifted coordinates, key a.
      minus: The update with -d on them, a fresh key b.
      level: The key-a update of zero gradients on the shifted coordinates (beside ``plus``: the
        response's sign).
      pair_a: The key-a update of zero gradients on the paired coordinates.
      pair_b: The key-b update on them (not shifted: two fresh draws with the same gradients).

    """

    real: np.ndarray
    fresh: np.ndarray
    plus: np.ndarray
    minus: np.ndarray
    level: np.ndarray
    pair_a: np.ndarray
    pair_b: np.ndarray


def noise_defects(
    key: jax.Array, problem: TrainingProblem, tx, prep: Prepared, *, keys: int = KEYS
) -> tuple[Defect, ...]:
    """The step's noise probed before training: a tuple of :class:`Defect` (empty when none fails).

    Args:
      key: A typed PRNG key (the probe runs' keys and their fresh keys are split from it).
      problem: The problem (its sampler's capacity, T, and the claimed S and C, if known: the size
        test needs both).
      tx: The step (built for D's size).
      prep: What :func:`~cbdp_jax._src.training_auditor.prepare.prepare` fixed (parameters, raw keys).
      keys: Probe runs, vmapped.

    Returns:
      One :class:`Defect` per failed family of tests (the most significant test of each), at the
      family-wise level ``LEVEL`` over all of them.

    """
    cap = problem.sampler.capacity(problem.examples)
    watched, shifted, paired, names = _coordinates(prep.params, cap)
    clip = problem.l2_norm_clip
    noise = problem.noise_multiplier
    shift = 1.0 if clip is None else min(clip, noise * clip / math.sqrt(2.0)) if noise else clip
    run = _program(tx, prep, cap, problem.steps, watched, shifted, paired, shift)
    leaves = max(len(jax.tree.leaves(tx.init(prep.params))), 1)
    # every key the probe runs use, split here: inside the program, only the step's own draws
    start, fresh = jax.random.split(key)
    starts = jax.random.split(start, (keys, leaves))
    fresh = jax.random.split(fresh, (keys, problem.steps, 2, leaves))
    rec = Probe(*(np.asarray(a, np.float64) for a in run(starts, fresh)))
    if not all(np.all(np.isfinite(a)) for a in rec):  # an audit that could not check never passes
        return (
            Defect(
                "noise-unchecked",
                "the step's update of zero gradients (padded batch slots hold them too) is NaN or "
                "inf, so its noise could not be probed: nothing the accountant assumes of it is "
                "checked",
            ),
        )
    same = (rec.real == rec.fresh).all(axis=(0, 2))  # [T]: the key changes nothing
    moved = (rec.plus != rec.level).any(axis=(0, 2))  # [T]: the gradient moves the update
    if same.all() and moved.any():
        return (
            Defect(
                "noise-not-keyed",
                "the step's update does not change with the run's key at any step (no noise, or "
                "noise from a key held outside the step's state): every run draws the same noise, "
                "and the accountant's noise is absent",
            ),
        )
    out = []
    # a step that responds to neither key nor gradient (a schedule at 0) releases nothing: not named
    missing = [t for t in range(problem.steps) if same[t] and moved[t]]
    if missing:
        out.append(
            Defect(
                "noise-missing",
                f"the step's update does not change with its key at steps {_steps(missing)} of "
                f"{problem.steps} (counted from 0): no noise there, while the accountant assumes "
                "noise at every step",
            )
        )
    alive = ~same
    out += _freshness(rec, alive)
    coupled = _coordinate_dependence(rec.pair_a - rec.pair_b, alive, paired, names)
    out += coupled
    if clip is not None and noise is not None and not coupled:  # the size test needs independence
        out += _calibration(rec, alive, shifted, names, leaves=_leaf_of(prep.params, shifted),
                            shift=shift, claimed=noise * clip)  # fmt: skip
    return tuple(out)


def verdict_with_defects(verdict: str, violation: bool, defects) -> str:
    """An audit's verdict, saying so where the step failed probes and no violation is certified.

    A defect means the claim's accountant does not describe the step, so "no violation" is never
    left plain beside one; beside a certified violation the verdict stands as it is.
    """
    if not defects or violation:
        return verdict
    return (
        f"{verdict}; but the step fails {len(defects)} of the noise probes "
        f"({', '.join(d.kind for d in defects)}): the claim's accountant does not describe "
        "this step, so no violation certified is not a clean bill"
    )


def _p(p: float) -> str:
    return f"{max(float(p), 1e-300):.1e}"


def _listed(labels) -> str:
    shown = ", ".join(labels[:4])
    return shown + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")


def _steps(ts) -> str:
    shown = ", ".join(str(t) for t in ts[:6])
    return shown + (f" and {len(ts) - 6} more" if len(ts) > 6 else "")


def _coordinates(params, cap: int):
    """Flat indices: watched (F), shifted (M, in F) and paired (Q, in F), and their names.

    Every leaf gets the same offsets: even ones shifted, odd ones paired (so noise shared between
    leaves shows at equal offsets), at most one shifted coordinate per example slot.
    """
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    sizes = [int(np.size(leaf)) for _, leaf in paths]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    per_f = max(2, WATCHED // len(sizes))
    per_m = max(1, min(cap, SHIFTED) // len(sizes))
    watched, shifted, paired, names = [], [], [], {}
    for (path, _), start, size in zip(paths, starts, sizes, strict=True):
        name = jax.tree_util.keystr(path, simple=True, separator=".").removesuffix(".value")
        watched += range(start, start + min(size, max(per_f, 2 * per_m)))
        for j in range(min(size, 2 * per_m)):
            names[start + j] = f"{name}[{j}]" if size > 1 else name
            group = shifted if j % 2 == 0 else paired
            if j % 2 or len(shifted) < min(cap, SHIFTED):
                group.append(start + j)
    return np.array(watched), np.array(shifted, int), np.array(paired, int), names


def _leaf_of(params, coords) -> list[str]:
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    sizes = np.cumsum([int(np.size(leaf)) for _, leaf in paths])
    labels = [
        jax.tree_util.keystr(p, simple=True, separator=".").removesuffix(".value") for p, _ in paths
    ]
    return [labels[int(np.searchsorted(sizes, c, side="right"))] for c in coords]


_PROGRAMS: dict = {}


def _program(tx, prep: Prepared, cap: int, steps: int, watched, shifted, paired, shift: float):
    """The probe runs as one compiled function of the keys, kept per step and layout.

    The parameters are an argument, so another problem with the same step object and shapes (a
    second :func:`prepare` of one problem) reuses the program.
    """
    shapes = tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves(prep.params))
    layout = (tuple(watched), tuple(shifted), tuple(paired))
    spec = (id(tx), str(jax.tree.structure(prep.params)), shapes, cap, steps, layout, shift,
            prep.raw_keys)  # fmt: skip
    hit = _PROGRAMS.get(spec)
    if hit is not None and hit[0] is tx:
        return hit[1]
    run = _build(tx, prep, cap, steps, watched, shifted, paired, shift)
    while len(_PROGRAMS) >= 4:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[spec] = (tx, run)
    return run


def _build(tx, prep: Prepared, cap: int, steps: int, watched, shifted, paired, shift: float):
    """Zero gradients for ``steps`` steps per run, four applications of the step a step.

    At each step: the run's own update (zero gradients), and from the same state with fresh keys:
    zero gradients (key a), +d on the shifted coordinates (key a again: beside the zero draw, the
    response's sign), -d on them (key b). The paired coordinates are shifted in neither.
    """
    raw = prep.raw_keys
    flat, unravel = ravel_pytree(prep.params)
    zeros = jax.tree.map(lambda p: jnp.zeros((cap, *p.shape), p.dtype), prep.params)
    rows = jnp.zeros((cap, flat.size), flat.dtype)
    rows = rows.at[jnp.arange(len(shifted)), jnp.asarray(shifted)].set(shift)
    plus = jax.vmap(unravel)(rows)
    minus = jax.tree.map(jnp.negative, plus)
    mask = jnp.ones(cap, bool)
    f_idx, m_idx, q_idx = (jnp.asarray(c) for c in (watched, shifted, paired))
    batches = jax.tree.map(lambda *g: jnp.stack(g), zeros, zeros, plus, minus)

    def one_run(start, fresh, batches, params):  # arrays as arguments: XLA does not fold them
        fl = lambda u: ravel_pytree(u)[0]

        def one(state, p, g):
            u, new_state = apply_step(tx, g, state, p, mask)
            return fl(u), new_state

        def body(carry, ks):  # ks [2, leaves]: the fresh keys a and b
            p, state = carry
            states = [state] + [rekey_with(state, ks[i], raw) for i in (0, 0, 1)]
            states = jax.tree.map(lambda *a: jnp.stack(a), *states)
            u, new = jax.vmap(one, in_axes=(0, None, 0))(states, p, batches)  # one traced step
            rec = (u[0, f_idx], u[1, f_idx], u[2, m_idx], u[3, m_idx], u[1, m_idx],
                   u[1, q_idx], u[3, q_idx])  # fmt: skip
            real = jax.tree.map(lambda a: a[0], new)
            return (optax.apply_updates(p, unravel(u[0])), real), rec

        state = rekey_with(tx.init(params), start, raw)
        return jax.lax.scan(body, (params, state), fresh)[1]

    program = jax.jit(
        jax.vmap(one_run, in_axes=(0, 0, None, None)), compiler_options=quick_options()
    )
    return lambda starts, fresh: program(starts, fresh, batches, prep.params)


def _sign_p(wins: np.ndarray, total: np.ndarray) -> np.ndarray:
    """One-sided binomial p-value of ``wins`` of ``total`` fair coins (exact; 1 where total is 0)."""
    return np.where(total > 0, stats.binom.sf(wins - 1, np.maximum(total, 1), 0.5), 1.0)


def _closeness(u: np.ndarray, past: np.ndarray) -> np.ndarray:
    """|cos(u_t, past_s)| - |u_t - past_s| / (|u_t| + |past_s|) ``[keys, t, s]``: 1 for equal updates.

    The cosine alone ties every pair of a one-parameter model; the relative distance tells equal
    updates from proportional ones.
    """
    dots = np.einsum("ktf,ksf->kts", u, past)
    nu, npast = np.linalg.norm(u, axis=-1)[:, :, None], np.linalg.norm(past, axis=-1)[:, None, :]
    both = nu * npast
    cos = np.where(both > 0, np.abs(dots) / np.where(both > 0, both, 1.0), 0.0)
    gap = np.sqrt(np.maximum(nu**2 + npast**2 - 2.0 * dots, 0.0))
    total = nu + npast
    return cos - np.where(total > 0, gap / np.where(total > 0, total, 1.0), 0.0)


def _freshness(rec: Probe, alive: np.ndarray) -> list[Defect]:
    """Sign test per step t >= 1: the real update is closer to the past than a fresh draw.

    The statistic of step t is max over s < t of :func:`_closeness` (update_t, real update_s), for
    the real update and for the fresh-key one from the same state; given the past they are exchangeable for
    a correct step, so the real one wins as often as a fair coin (ties dropped).
    """
    steps = rec.real.shape[1]
    tested = [t for t in range(1, steps) if alive[t]]
    if not tested:
        return []
    level = LEVEL / 3 / len(tested)
    before = np.tril(np.ones((steps, steps), bool), -1)  # [t, s]: s < t
    real = _closeness(rec.real, rec.real)
    r_max = np.where(before, real, -2.0).max(axis=2)  # [keys, T]
    f_max = np.where(before, _closeness(rec.fresh, rec.real), -2.0).max(axis=2)
    wins, total = np.sum(r_max > f_max, axis=0), np.sum(r_max != f_max, axis=0)
    p = _sign_p(wins, total)
    t = min(tested, key=lambda i: p[i])
    if not p[t] <= level:
        return []
    med = np.median(real[:, t, :t], axis=0)
    s = int(np.argmax(med))
    dots = np.einsum("kf,kf->k", rec.real[:, t], rec.real[:, s])
    norms = np.linalg.norm(rec.real[:, t], axis=-1) * np.linalg.norm(rec.real[:, s], axis=-1)
    r = float(np.median(np.abs(dots) / np.maximum(norms, 1e-300)))
    what = "identical to" if r > 0.9999 else "tied to"
    bad = [i for i in tested if p[i] <= level]
    return [
        Defect(
            "noise-not-fresh",
            f"the noise at step {t} is {what} the noise at step {s} (correlation {r:.3f}, median of "
            f"{rec.real.shape[0]} runs); a fresh key at the same state draws other noise "
            f"({int(wins[t])} of {int(total[t])} runs closer to the past, p <= {_p(p[t])}; "
            f"{len(bad)} of {len(tested)} steps so): the accountant's independence assumption fails",
            statistic=r,
            p_value=float(p[t]),
            level=level,
        )
    ]


def _coordinate_dependence(diff: np.ndarray, alive, shifted, names) -> list[Defect]:
    """Sign agreement of two fresh draws' difference on pairs of coordinates (Hoeffding-Azuma).

    Given the state, the difference of two draws with fresh keys and the same gradients is
    symmetric (swap the keys), and independent across coordinates for a coordinate-wise
    post-processing: where both are non-zero, their signs agree as a fair coin does.
    """
    m = diff.shape[-1]
    if m < 2:  # a one-parameter model (worst-case data): no pair
        return []
    s = np.sign(diff[:, alive]).reshape(-1, m)
    agree = s.T @ s
    total = np.abs(s).T @ np.abs(s)
    pairs = m * (m - 1) // 2
    level = LEVEL / 3 / pairs
    iu = np.triu_indices(m, 1)
    a, n = agree[iu], total[iu]
    p = np.where(n > 0, np.minimum(1.0, 2.0 * np.exp(-(a**2) / (2.0 * np.maximum(n, 1)))), 1.0)
    i = int(np.argmin(p))
    if not p[i] <= level:
        return []
    j, k = int(iu[0][i]), int(iu[1][i])
    share = (n[i] + a[i]) / (2.0 * n[i])
    name_j, name_k = names[int(shifted[j])], names[int(shifted[k])]
    return [
        Defect(
            "noise-dependent-coordinates",
            f"the noise on {name_j} and {name_k} moves together: two fresh draws differ with the "
            f"same sign on both in {100 * share:.1f}% of {int(n[i])} draws (p <= {_p(p[i])}; "
            f"{int(np.sum(p <= level))} of {pairs} coordinate pairs so): the accountant's "
            "independence across coordinates fails",
            statistic=float(share),
            p_value=float(p[i]),
            level=level,
        )
    ]


def _calibration(rec, alive, shifted, names, *, leaves, shift: float, claimed: float):
    """Whether the shifted noise's ordering bounds its std below the claimed S C (one-sided)."""
    orient = np.sign(np.sum(np.sign(rec.plus - rec.level), axis=0))  # [T, M]: the response's sign
    wins = (orient[None] * (rec.plus - rec.minus)) > 0  # [keys, T, M]
    used = (orient != 0) & alive[:, None]
    p0 = float(stats.norm.cdf(math.sqrt(2.0) * shift / claimed))
    groups = {f"leaf {leaf}": [j for j, lf in enumerate(leaves) if lf == leaf] for leaf in leaves}
    tests = [(g, np.ones_like(alive), cols) for g, cols in groups.items()]
    tests += [(f"step {t}", np.arange(alive.size) == t, list(range(len(leaves))))
              for t in range(alive.size) if alive[t]]  # fmt: skip
    level = LEVEL / 3 / max(len(tests), 1)
    worst, failed = None, []
    for label, steps, cols in tests:
        sel = used[steps][:, cols]
        count = int(sel.sum()) * wins.shape[0]
        if not count:
            continue
        share = float(wins[:, steps][:, :, cols][:, sel].mean())
        p = math.exp(-2.0 * count * max(share - p0, 0.0) ** 2) if share > p0 else 1.0
        failed += [label] if p <= level else []
        if p <= level and (worst is None or p < worst[0]):
            worst = (p, label, share, count)
    if worst is None:
        return []
    p, label, share, count = worst
    low = share - math.sqrt(math.log(1.0 / level) / (2.0 * count))  # the share's lower bound
    bound = math.sqrt(2.0) * shift / stats.norm.ppf(low) / claimed if low > 0.5 else math.inf
    return [
        Defect(
            "noise-too-small",
            f"on {label} the noise is at most {bound:.3g}x the claimed S C = {claimed:g}: a shift "
            f"of +-{shift:.3g} in the gradient is ordered in {100 * share:.1f}% of {count} draws, "
            f"noise of std S C orders at most {100 * p0:.1f}% (p <= {_p(p)}; so on "
            f"{_listed(failed)}): the accountant's noise multiplier overstates the noise",
            statistic=bound,
            p_value=p,
            level=level,
        )
    ]
