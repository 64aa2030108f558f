"""Probes of a DP step before any training: is it a DP step, and what can the audit not see.

:func:`check_step` refuses, in one line, a step that cannot take per-example gradients (a plain optax
optimizer given where a DP step is expected fails on the batch axis, or treats it as a parameter
axis), saying how to wrap it. :func:`blind_spots` applies the step to a few hand-made batches with
the same state (so the noise cancels in differences) and names what the audit cannot see by
construction (docs/theory/training_audit.md, section 6):

* ``'clip-not-binding'``: the step's response to the gradient canary grows with its norm, and the
  canary's norm is not above the run's clipping norm (or that is not known), so a step that does not
  clip would look the same (above a known C, that growth is the step's flaw, which the audit sees);
* ``'unnoised-parameters'``: the step's noise does not reach some parameters (or does not change
  with the run's key at all), and the canary does not lie along them;
* ``'batch-normalisation'``: the step's response to one example depends on how many others share
  its batch (a division by the realized batch size or by a count of non-zero gradients), while the
  canary lies along a coordinate no example moves, where that division moves exactly as the
  accountant says, or the relation is zero-out;
* ``'dataset-size'``: the step is built from the data set's size, and the relation keeps the size
  (zero-out, replace-one) or the canary's coordinate hides the division.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from cbdp_jax._src.infra.programs import quick_options
from cbdp_jax._src.infra.validation import InvalidParameterError
from cbdp_jax._src.mechanism_auditor.results import BlindSpot
from cbdp_jax._src.training_auditor.ops import Prepared, apply_step, lone_response, rekey
from cbdp_jax._src.training_auditor.problem import TrainingProblem

_WRAP = (
    "a DP step takes per-example gradients [batch, ...] and returns one update; wrap a plain "
    "optimizer as optax.chain(optax.contrib.differentially_private_aggregate(l2_norm_clip=C, "
    "noise_multiplier=S, seed=0), optax.sgd(lr)), or use optax.contrib.dpsgd or dp_sgd"
)


def check_step(problem: TrainingProblem, tx, params) -> None:
    """Raises one line unless ``tx`` maps per-example gradients to one update of the params' shapes."""
    try:
        state = tx.init(params)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's step
        raise InvalidParameterError(f"step is invalid: its init failed ({_first(exc)})") from exc
    cap = problem.sampler.capacity(problem.examples)
    grads = jax.tree.map(lambda p: jax.ShapeDtypeStruct((cap, *p.shape), p.dtype), params)
    mask = jax.ShapeDtypeStruct((cap,), jnp.bool_)
    try:
        out, _ = jax.eval_shape(lambda g, m: apply_step(tx, g, state, params, m), grads, mask)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's step
        raise InvalidParameterError(
            f"step is invalid: its update failed on per-example gradients ({_first(exc)}): {_WRAP}"
        ) from exc
    want = [tuple(p.shape) for p in jax.tree.leaves(params)]
    got = [tuple(u.shape) for u in jax.tree.leaves(out)]
    if jax.tree.structure(out) != jax.tree.structure(params) or got != want:
        i = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), 0)
        raise InvalidParameterError(
            f"step is invalid: its update has shape {list(got[i]) if got else []} where the "
            f"parameter has {list(want[i])}: it treats the batch axis as a parameter axis (a plain "
            f"optax optimizer?); {_WRAP}"
        )


def _first(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def blind_spots(problem: TrainingProblem, tx, prep: Prepared) -> tuple[BlindSpot, ...]:
    """What this audit cannot see by construction, from the step's response to probe batches."""
    out = []
    cap = problem.sampler.capacity(problem.examples)
    probe = prep.canary_grad if prep.canary_grad is not None else prep.direction
    base = lone_response(tx, prep.params, prep.direction, probe, cap)
    gradient = problem.threat == "gradient"
    if gradient and not _above_known_clip(problem):
        half = lone_response(tx, prep.params, prep.direction, _scaled(probe, 0.5), cap)
        if abs(base) > 1.5 * abs(half) > 0:
            out.append(
                BlindSpot(
                    "clip-not-binding",
                    f"the step's response to the canary grows with its norm ({base / half:.3g}x "
                    f"from norm {problem.canary_norm() / 2:g} to {problem.canary_norm():g}): "
                    "clipping does not bind on it, so a step that does not clip looks the same; "
                    "give a canary norm above the clipping norm",
                )
            )
    out += _noise_spots(problem, tx, prep)
    k = min(7, cap - 1)
    if k >= 1:
        other = _aside(prep.direction, 0.5 * _norm(probe))
        others = (k, jax.tree.map(lambda g: jnp.broadcast_to(g, (k, *g.shape)), other))
        shared = lone_response(tx, prep.params, prep.direction, probe, cap, others)
        if abs(shared - base) > 1e-3 * abs(base):
            out += _normalisation_spots(problem, tx, prep, shared / base, k, probe)
    if not isinstance(problem.step, optax.GradientTransformation):  # a step per data set
        out += _size_spots(problem, prep, base, cap, probe)
    return tuple(out)


def _norm(tree) -> float:
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree))))


def _aside(direction, norm: float):
    """A gradient of ``norm`` along the coordinate where ``direction`` is smallest (zero: disjoint).

    Others that share the batch there leave the aggregate along the canary's own coordinates as it
    is, so a coordinate-wise post-processing (momentum, Adam) responds to the canary as it does
    alone; only a step that divides by a count of examples (or acts on the whole aggregate) does
    not.
    """
    flat, unravel = ravel_pytree(direction)
    i = int(jnp.argmin(jnp.abs(flat)))
    return unravel(jnp.zeros_like(flat).at[i].set(norm))


def _above_known_clip(problem: TrainingProblem) -> bool:
    """Whether the canary's norm is above the run's known clipping norm C.

    Then a step whose response grows with the canary's norm does not clip at C: a flaw the audit
    sees (the canary's clipped share is C, the step's is more), not a blind spot.
    """
    clip = problem.l2_norm_clip
    return clip is not None and problem.canary_norm() > clip


def _scaled(tree, c: float):
    return jax.tree.map(lambda g: c * g, tree)


def _noise_spots(problem: TrainingProblem, tx, prep: Prepared) -> list[BlindSpot]:
    """Parameters the step's noise does not reach: 32 keys' updates of a zero batch all equal there."""
    cap = problem.sampler.capacity(problem.examples)
    zeros = jax.tree.map(lambda p: jnp.zeros((cap, *p.shape), p.dtype), prep.params)
    mask = jnp.ones(cap, bool)
    state = tx.init(prep.params)

    def update(key):  # a coordinate-wise post-processing (Adam) can tie two draws: 32 keys
        new = rekey(state, key, prep.raw_keys)
        return ravel_pytree(apply_step(tx, zeros, new, prep.params, mask)[0])[0]

    # one program (op-by-op dispatch under vmap compiles each operation on its own)
    ups = jax.jit(jax.vmap(update), compiler_options=quick_options())(
        jax.random.split(jax.random.key(1), 32)
    )
    still = np.asarray(jnp.all(ups == ups[:1], axis=0))
    if not still.any():
        return []
    if still.all():
        return [
            BlindSpot(
                "unnoised-parameters",
                "the step's noise does not change with the run's key (no noise, or a key held "
                "outside the step's state): every run draws the same noise",
            )
        ]
    names = _names(prep.params, still)
    if problem.threat == "gradient" and not still[prep.coordinate]:
        text = (
            f"the step adds no noise to {int(still.sum())} of {still.size} parameters ({names}); "
            f"the canary lies along parameter {prep.coordinate}, which is noised, so a leak through "
            f"them is not seen: give Canary(coordinate={int(np.argmax(still))}) to audit one of them"
        )
    elif problem.threat != "gradient":
        text = (
            f"the step adds no noise to {int(still.sum())} of {still.size} parameters ({names}); "
            f"the {problem.threat} score mixes them with noised parameters and sees them only partly"
        )
    else:
        return []
    return [BlindSpot("unnoised-parameters", text)]


def _names(params, mask: np.ndarray) -> str:
    """The parameter paths holding a coordinate of ``mask`` (at most 3 named)."""
    paths, start, names = jax.tree_util.tree_flatten_with_path(params)[0], 0, []
    for path, leaf in paths:
        size = int(np.size(leaf))
        if mask[start : start + size].any():
            names.append(jax.tree_util.keystr(path, simple=True, separator="."))
        start += size
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _hidden_by_coordinate(problem: TrainingProblem, prep: Prepared) -> bool:
    return problem.threat == "gradient" and prep.law_exact


def _counts_zeroed_slot(tx, prep: Prepared, cap: int, probe, k: int) -> bool:
    """Whether the step tells a zeroed slot (in the batch mask) from an absent one (k others in both)."""
    state = rekey(tx.init(prep.params), jax.random.key(0))
    batch = jax.tree.map(
        lambda g: jnp.zeros((cap, *g.shape), g.dtype).at[1 : k + 1].set(0.5 * g), probe
    )
    with_slot = apply_step(tx, batch, state, prep.params, jnp.arange(cap) <= k)[0]
    without = apply_step(
        tx, batch, state, prep.params, (jnp.arange(cap) >= 1) & (jnp.arange(cap) <= k)
    )[0]
    a, b = ravel_pytree(with_slot)[0], ravel_pytree(without)[0]
    return not bool(jnp.allclose(a, b, rtol=1e-5, atol=0.0))


def _times(ratio: float) -> str:
    """``'0.125x'``; a ratio under 0.001 in size reads ``'less than 0.001x'`` (never ``'-0x'``)."""
    if abs(ratio) < 1e-3:
        return "less than 0.001x"
    return f"{ratio + 0.0:.3g}x"


def _normalisation_spots(problem, tx, prep, ratio: float, k: int, probe) -> list[BlindSpot]:
    head = (
        f"the step's response to the canary changes when {k} other examples, along other "
        f"coordinates, share its batch ({_times(ratio)} its response alone; a division by the "
        "realized batch size or by a count of non-zero gradients does this, and so does an "
        "operation on the whole aggregate, such as clipping it)"
    )
    cap = problem.sampler.capacity(problem.examples)
    spots = []
    if prep.relation == "zero-out" and _counts_zeroed_slot(tx, prep, cap, probe, k):
        spots.append(
            BlindSpot(
                "batch-normalisation",
                f"{head}; it counts a zeroed slot of the batch as an example, and zero-out keeps "
                "the canary's slot there, so by construction zero-out cannot see all of the leak "
                "such a division causes: add-remove can",
            )
        )
    if _hidden_by_coordinate(problem, prep):
        spots.append(
            BlindSpot(
                "batch-normalisation",
                f"{head}; such a step leaks where the other examples' clipped gradients align "
                "with the canary's, and this canary lies along a coordinate no example moves, so "
                "by construction the audit cannot see that leak: audit on aligned data (data="
                "'worst-case') to see it",
            )
        )
    return spots


def _size_spots(problem, prep, base: float, cap: int, probe) -> list[BlindSpot]:
    """A step built per data set whose response depends on the size the relation keeps or hides."""
    other = problem.step_for(max(problem.examples // 2, 1))  # half the size: any dependence shows
    if abs(lone_response(other, prep.params, prep.direction, probe, cap) - base) <= 1e-3 * abs(
        base
    ):
        return []
    if prep.relation != "add-remove":
        text = (
            f"the step is built from the data set's size, which {prep.relation} keeps: D and D' "
            "divide by the same size, so a leak of that division is not seen; audit under add-remove"
        )
    elif _hidden_by_coordinate(problem, prep):
        text = (
            "the step is built from the data set's size (n + 1 on D, n on D'); this canary lies "
            "along a coordinate no example moves, where that division moves as the accountant "
            "says: audit on aligned data (data='worst-case') to see its leak"
        )
    else:
        return []
    return [BlindSpot("dataset-size", text)]
