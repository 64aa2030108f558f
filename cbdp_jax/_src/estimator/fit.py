"""The estimator's fit: the ensemble of adversaries trained, one member fixed, its affine maps fitted.

:func:`_train` trains a problem's ensemble (restarting with a smaller step on divergence), picks the
member with the best validation value and fits its conservative and closed-form ``(scale, shift)`` on
the member's outputs. :func:`_screen` trains every candidate input map for one validation block, so
only the leader is trained in full.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.estimator.adversary_fitting import train_ensemble
from cbdp_jax._src.estimator.adversary_fitting_ensemble import (
    bucket_rows,
    init_standardised_ensemble,
)
from cbdp_jax._src.estimator.core import fit_outputs
from cbdp_jax._src.estimator.evaluation import (
    Critic,
    rowwise_outputs,
)
from cbdp_jax._src.estimator.plan import _Problem
from cbdp_jax._src.estimator.types import EstimatorConfig
from cbdp_jax._src.infra import keys, threads
from cbdp_jax._src.infra.programs import persistent_jit
from cbdp_jax._src.privacy.divergences import Divergence


class _Trained(NamedTuple):
    """The selected member of a trained ensemble, with its fitted affine maps and its curves.

    ``scale`` / ``shift``: the conservative fit (best validation bound), where the certified critic
    starts; ``plain``: the closed-form ``(scale, shift)``, the estimate's critic. ``h_val`` and
    ``h_fit``: the member's raw outputs on the validation and fitting samples (host, float32).
    """

    graphdef: Any
    params: Any
    rest: Any
    scale: float
    shift: float
    plain: tuple[float, float]
    val_curve: np.ndarray
    train_curve: np.ndarray
    restarts: int
    warnings: tuple[str, ...]
    h_val: tuple[np.ndarray, np.ndarray]
    h_fit: tuple[np.ndarray, np.ndarray]


# The outputs the fit program reduces are padded to powers of two from this many rows (reductions
# of a few hundred thousand floats: the padding costs nothing that matters).
_MIN_FIT_ROWS = 1 << 16


@persistent_jit(static_argnames=("objective", "divergence"))
def _fit_program(h_fit, h_val, counts, z, *, objective: str, divergence: Divergence):
    """The conservative and the closed-form ``(scale, shift)`` from the member's outputs, one program.

    ``h_fit`` and ``h_val`` are ``(P, Q)`` outputs padded to buckets of rows, ``counts`` their sample
    counts (fit P, fit Q, validation P, validation Q): no program depends on the sample size, and
    none on the class (the outputs are computed by the row-wise program).
    """
    masks = [jnp.arange(h.shape[0]) < c for h, c in zip((*h_fit, *h_val), counts, strict=True)]
    return fit_outputs(
        objective, divergence, h_fit, h_val, z, masks_fit=tuple(masks[:2]),
        masks_val=tuple(masks[2:]),
    )  # fmt: skip


def _padded_outputs(h: np.ndarray) -> np.ndarray:
    """Outputs zero-padded to a power-of-two bucket of rows (:data:`_MIN_FIT_ROWS` at least)."""
    out = np.zeros(bucket_rows(h.shape[0], _MIN_FIT_ROWS), h.dtype)
    out[: h.shape[0]] = h
    return out


def _member(tree, member: int):
    """Member ``member`` of a stacked pytree, on the host (no indexing program per leaf)."""
    return jax.tree.map(lambda x: np.asarray(x)[member], jax.device_get(tree))


def _train(key: jax.Array, prob: _Problem, z: float) -> _Trained:
    """Trains the ensemble (restarting with a smaller step on divergence) and fixes one member."""
    config, trainer = prob.config, prob.trainer
    member_keys, k_train = _ensemble_keys(key, config.ensemble)
    warnings: list[str] = []
    lr = config.learning_rate
    restarts = 0
    while True:
        # The step size lives in the optimiser state: a restart with a smaller one does not recompile.
        state, out = _run_ensemble(
            member_keys, keys.fold_in(k_train, restarts), prob, lr, steps=config.steps,
            batch_size=config.batch_size, progress=config.progress, patience=config.patience,
        )  # fmt: skip
        finite = np.asarray(out.finite)
        if finite.all() or restarts >= config.max_restarts:
            break
        restarts += 1
        lr = lr / 10.0
        warnings.append(
            f"training diverged (NaN or inf) in {int((~finite).sum())} of {finite.size} adversaries; "
            f"restarted with learning rate {lr:g}"
        )
    if not finite.any():
        warnings.append("training diverged in every adversary even after restarts")
    best_values = np.where(finite, np.asarray(out.best_value), -np.inf)
    member = int(np.argmax(best_values))
    params_m, rest_m = _member(out.best_params, member), _member(state.rest, member)
    raw = _typed_critic(params_m, rest_m, 1.0, 0.0)
    h_fit = tuple(rowwise_outputs(trainer.graphdef, raw, x)[0] for x in prob.fit_batch)
    h_val = tuple(rowwise_outputs(trainer.graphdef, raw, x)[0] for x in prob.val)
    counts = np.array([h.shape[0] for h in (*h_fit, *h_val)], np.int32)
    (fscale, fshift), (pscale, pshift) = _fit_program(
        tuple(_padded_outputs(h) for h in h_fit), tuple(_padded_outputs(h) for h in h_val),
        counts, np.asarray(z, h_val[0].dtype), objective=trainer.objective,
        divergence=prob.divergence,
    )  # fmt: skip
    # Blocks a patience stop skipped have NaN rows (training never makes NaN: a diverged member's
    # value is -inf); the curves end where training did.
    ran = int(np.sum(~np.isnan(np.asarray(out.trace.val_value)[:, member])))
    return _Trained(
        trainer.graphdef,
        params_m,
        rest_m,
        float(fscale),
        float(fshift),
        (float(pscale), float(pshift)),
        np.asarray(out.trace.val_value)[:ran, member],
        np.asarray(out.trace.train_value)[:ran, member],
        restarts,
        tuple(warnings),
        h_val,
        h_fit,
    )


def _ensemble_keys(key: jax.Array, ensemble: int) -> tuple[jax.Array, jax.Array]:
    """``(member initialisation keys [ensemble], training key)`` of one ensemble run from ``key``."""
    k_init, k_train = keys.split(key)
    return keys.split_array(k_init, num=ensemble), k_train


def _run_ensemble(
    member_keys, key, prob: _Problem, lr: float, *, steps: int, batch_size, progress, patience
):
    """``(initial state, TrainOutput)``: the problem's ensemble initialised and trained ``steps`` steps."""
    config, trainer = prob.config, prob.trainer
    loc, scale = prob.standardisation
    state = init_standardised_ensemble(member_keys, trainer, loc, scale, learning_rate=lr)
    out = train_ensemble(
        key,
        trainer,
        state,
        val_p=prob.val_padded[0],
        val_q=prob.val_padded[1],
        val_counts=prob.val_counts,
        train_p=None if prob.train is None else prob.train[0],
        train_q=None if prob.train is None else prob.train[1],
        sampler=prob.sampler,
        steps=steps,
        eval_every=config.eval_every,
        batch_size=None if trainer.line_search else batch_size,
        progress=progress,
        patience=patience,
        cancelled=threads.cancelled,
    )
    return state, out


# The screen's key is ``fold_in(map key, _SCREEN_STREAM)``: the map's full training only splits the
# map key, and a fold-in with this constant hashes the key with a different input.
_SCREEN_STREAM = 0x5C4EE2


# The screen's minibatch per side, at most: its one block only has to rank the maps, not fit a critic.
# Against the side-by-side benchmark's batch of 2048 it cut the screen of a warm mean-v2 call at 10^5
# per side from about 225 to 70-74 ms of each direction's wall time (its table in
# benchmarks/measured/profile-warm/README.md), with the same maps and bounds in all 64 units of
# benchmarks/measured/map-race/README.md.
_SCREEN_BATCH = 512


def _screen_steps(config: EstimatorConfig) -> int:
    """The screen's steps per map: one validation block, at least a third of the steps up to 100.

    Short budgets validate often (:func:`default_budget`'s 10 checks); the screen still trains each
    map as long as it did at the fixed budget's 100-step blocks, or a third of the budget if less.
    """
    return max(config.eval_every, min(100, config.steps // 3))


def _screen_batch(config: EstimatorConfig) -> int | None:
    """The screen's minibatch: the configured one, at most ``_SCREEN_BATCH`` (None: full batch)."""
    return None if config.batch_size is None else min(config.batch_size, _SCREEN_BATCH)


def _screen(map_keys, probs: list[_Problem]) -> tuple[int, list[float]] | None:
    """``(leader, values)``: every map trained for one validation block, from a key of its own.

    The block runs at a minibatch of at most ``_SCREEN_BATCH`` per side (:func:`_screen_batch`).

    The value of a map is its ensemble's best validation objective (training's own early-stopping
    value, the initial critic included), so the screen costs one block of training per map and no
    evaluation beyond it. Of equal values the first map (``'standard'``) leads. None where the
    budget has fewer than two blocks (the screen would cost as much as the training) or no map's
    value is finite (all diverged: the full selection restarts them).
    """
    config = probs[0].config
    if config.steps // config.eval_every < 2:
        return None
    values = []
    for k, prob in zip(map_keys, probs, strict=True):
        member_keys, k_train = _ensemble_keys(keys.fold_in(k, _SCREEN_STREAM), config.ensemble)
        _, out = _run_ensemble(
            member_keys, k_train, prob, config.learning_rate, steps=_screen_steps(config),
            batch_size=_screen_batch(config), progress=None, patience=None,
        )  # fmt: skip
        best = np.where(np.asarray(out.finite), np.asarray(out.best_value), -np.inf)
        values.append(float(np.max(best)))
    if not any(math.isfinite(v) for v in values):
        return None
    return int(np.argmax(values)), values


def _typed_critic(params, rest, scale, shift, bound=math.inf) -> Critic:
    """A :class:`Critic` whose numbers are scalars of the outputs' dtype (one program for all)."""
    dtype = np.asarray(jax.tree.leaves(params)[0]).dtype
    return Critic(params, rest, *(np.asarray(v, dtype) for v in (scale, shift, bound)))
