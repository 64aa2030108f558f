"""The sweep's plan: the grid checked and cut into groups of one shape and batches of members.

The mechanisms, classes, alphas and seeds checked; members of one adversary shape and dimension
grouped (one compiled program each), groups cut into batches of ``max_batch`` members padded to one
shape; the per-member input arrays, their keys, and the device mesh the member axis is sharded over.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cbdp_jax._src.estimator.adversaries import (
    ADVERSARY_NAMES,
    AdversarySpec,
    CustomAdversary,
    check_option_applies,
    make_adversary,
    options_for,
)
from cbdp_jax._src.estimator.certification import (
    resolve_guarantee,
    tail_target,
)
from cbdp_jax._src.estimator.core import (
    Trainer,
    cached_trainer,
    objective_kind,
    spec_properties,
)
from cbdp_jax._src.estimator.objectives import kl_domain_reduction
from cbdp_jax._src.estimator.sweep_types import (
    MEMBER_AXIS,
    SWEEP_DIVERGENCES,
    Member,
    MemberInputs,
    SweepConfig,
    _divergence,
    _Static,
)
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_alpha,
    check_choice,
    check_int_at_least,
    check_key,
    check_positive,
)
from cbdp_jax._src.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    Mechanism,
)
from cbdp_jax._src.privacy.divergences import get_divergence


def _put(tree, sharding: NamedSharding):
    """Places host arrays (identical in every process) on the mesh, sharded along their first axis."""

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(one, tree)


def _as_mechanisms(mechanisms) -> tuple[LaplaceMechanism | GaussianMechanism, ...]:
    if isinstance(mechanisms, Mechanism):
        mechanisms = (mechanisms,)
    mechs = tuple(mechanisms)
    if not mechs:
        raise InvalidParameterError("mechanisms=() is invalid: give at least one mechanism")
    for m in mechs:
        if not isinstance(m, (LaplaceMechanism, GaussianMechanism)) or m.query is not None:
            raise InvalidParameterError(
                f"mechanisms entry {m!r} is invalid: a sweep samples the canonical pair of a "
                "LaplaceMechanism or GaussianMechanism without a query (P = M(0), Q = M(v))"
            )
    return mechs


def _as_specs(adversaries, options: dict[str, Any]) -> tuple[AdversarySpec, ...]:
    if isinstance(adversaries, (str, AdversarySpec, CustomAdversary)):
        adversaries = (adversaries,)
    names = [a for a in adversaries if not isinstance(a, (AdversarySpec, CustomAdversary))]
    for name in names:
        check_choice("adversary", name, ADVERSARY_NAMES)
    # Options are shared by the classes given by name: each takes those that apply to it, and an
    # option that applies to none of them is an error naming the option and the classes.
    for option, value in options.items():
        if value is not None and not any(option in options_for(n, options) for n in names):
            if not names:
                raise InvalidParameterError(
                    f"{option}={value!r} is invalid: adversary options complete classes given by "
                    "name, and every class here is an AdversarySpec"
                )
            check_option_applies(names[0], option, value)
    specs = tuple(
        a
        if isinstance(a, (AdversarySpec, CustomAdversary))
        else make_adversary(a, **options_for(a, options))
        for a in adversaries
    )
    if not specs:
        raise InvalidParameterError("adversaries=() is invalid: give at least one class")
    return specs


def _as_alphas(divergence: str, alphas) -> tuple[float | None, ...]:
    if divergence == "kl":
        if alphas is not None:
            raise InvalidParameterError(
                f"alphas={alphas!r} is invalid: KL has no order (leave alphas=None)"
            )
        return (None,)
    if alphas is None:
        raise InvalidParameterError(
            f"alphas=None is invalid: divergence={divergence!r} needs orders"
        )
    if isinstance(alphas, (int, float)):
        alphas = (alphas,)
    return tuple(check_alpha(a) for a in alphas)


def _as_seeds(seeds) -> tuple[int, ...]:
    if isinstance(seeds, int):
        return tuple(range(check_int_at_least("seeds", seeds, 1)))
    out = tuple(int(s) for s in seeds)
    if not out or len(set(out)) != len(out):
        raise InvalidParameterError(f"seeds={seeds!r} is invalid: must be distinct integers")
    return out


def _shape_signature(spec: AdversarySpec, dim: int, dtype) -> tuple[Any, Any]:
    abstract = nnx.eval_shape(lambda: spec.build(jax.random.key(0), dim, dtype=dtype))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten((params, rest))
    return graphdef, (treedef, tuple((x.shape, str(x.dtype)) for x in leaves))


class _Group(NamedTuple):
    static: _Static
    specs: tuple[AdversarySpec, ...]
    members: tuple[int, ...]


class _Plan(NamedTuple):
    members: tuple[Member, ...]
    groups: tuple[_Group, ...]
    divergence: str
    convention: str
    config: SweepConfig
    key_impl: str


def _plan(
    key: jax.Array,
    mechanisms,
    *,
    adversaries,
    divergence: str,
    alphas,
    seeds,
    learning_rates,
    convention: str,
    config: SweepConfig,
    adversary_options: dict[str, Any],
) -> _Plan:
    check_key(key)
    check_choice("divergence", divergence, SWEEP_DIVERGENCES)
    check_choice("convention", convention, ("abs", "nonneg"))
    mechs = _as_mechanisms(mechanisms)
    # Every sweep mechanism has Laplace or Gaussian noise, so the KL rule depends on the class only.
    reduced = [
        kl_domain_reduction(mechs[0], s, divergence)
        for s in _as_specs(adversaries, adversary_options)
    ]
    specs = tuple(s for s, _ in reduced)
    notes = tuple(note for _, note in reduced)
    if config.guarantee == "finite-sample":
        for spec in specs:
            if spec.bound is None:
                raise InvalidParameterError(
                    f"guarantee='finite-sample' is invalid for the unbounded class {spec.label!r} in "
                    "a sweep: use a bounded class (bound=B), or the estimator, which chooses B on "
                    "validation data"
                )
    alpha_grid = _as_alphas(divergence, alphas)
    lrs = (config.learning_rate,) if learning_rates is None else tuple(learning_rates)
    lrs = tuple(check_positive("learning_rates", lr) for lr in lrs)
    seed_grid = _as_seeds(seeds)
    members = tuple(
        Member(i, m, s, j, a, lr, seed, notes[j])
        for i, (m, (j, s), a, lr, seed) in enumerate(
            itertools.product(mechs, enumerate(specs), alpha_grid, lrs, seed_grid)
        )
    )
    dtype = jnp.dtype(config.dtype)
    div_probe = get_divergence(
        divergence, alpha=2.0 if divergence != "kl" else None, convention=convention
    )
    groups: dict[Any, list[int]] = {}
    families: dict[Any, set[str]] = {}
    key_impl = str(jax.random.key_impl(key))
    signatures = {}
    for member in members:
        dim = member.mechanism.dim
        if (member.adversary, dim) not in signatures:
            signatures[member.adversary, dim] = _shape_signature(member.adversary, dim, dtype)
        graphdef, shapes = signatures[member.adversary, dim]
        kind = objective_kind(div_probe, spec_properties(member.adversary), config.tight)
        gkey = (dim, graphdef, shapes, kind)
        groups.setdefault(gkey, []).append(member.index)
        families.setdefault(gkey, set()).add(member.mechanism.family)
    out = []
    for gkey, idx in groups.items():
        dim, graphdef, _, kind = gkey
        fams = families[gkey]
        trainer = cached_trainer(
            members[idx[0]].adversary, div_probe, dim=dim, tight=config.tight, dtype=dtype
        )
        static = _Static(
            trainer=trainer,
            graphdef=graphdef,
            family=fams.pop() if len(fams) == 1 else "mixed",
            divergence=divergence,
            convention=convention,
            objective=kind,
            dim=dim,
            dtype=config.dtype,
            key_impl=key_impl,
            blocks=config.blocks,
            block_steps=config.block_steps,
            batch_size=config.batch_size,
            val_samples=config.val_samples,
            shared_noise=config.shared_noise,
            tail_need=_tail_need(tuple(members[i].adversary for i in idx), config),
        )
        group_specs = tuple(dict.fromkeys(members[i].adversary for i in idx))
        out.append(_Group(static, group_specs, tuple(idx)))
    return _Plan(members, tuple(out), divergence, convention, config, key_impl)


def _tail_need(specs: Sequence[AdversarySpec], config: SweepConfig) -> float:
    """The tail index a group's critics are shrunk to clear on validation data (0: no shrink).

    As in the estimator: only for cones (t h stays in the class) under the asymptotic guarantee.
    """
    asymptotic = all(resolve_guarantee(config.guarantee, s) == "asymptotic" for s in specs)
    if not (asymptotic and all(s.is_cone for s in specs)):
        return 0.0
    return tail_target(config.test_samples, config.tail_margin)


def _batches(members: Sequence[int], max_batch: int, n_devices: int) -> Iterator[tuple[int, ...]]:
    """Cuts a group into batches of one size (a multiple of the device count), padding the last."""
    size = min(max_batch, len(members))
    size = -(-size // n_devices) * n_devices
    for start in range(0, len(members), size):
        part = tuple(members[start : start + size])
        yield part + (part[-1],) * (size - len(part))


def _key_data(key: jax.Array, seeds: Sequence[int]) -> np.ndarray:
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(seeds, jnp.uint32))
    return np.asarray(jax.random.key_data(keys))


def _member_arrays(plan: _Plan, idx: Sequence[int], key: jax.Array) -> MemberInputs:
    members = [plan.members[i] for i in idx]
    return MemberInputs(
        key_data=_key_data(key, [m.seed for m in members]),
        alpha=np.array([np.nan if m.alpha is None else m.alpha for m in members]),
        noise_scale=np.array([m.mechanism.noise_scale for m in members]),
        sensitivity=np.array([m.mechanism.sensitivity for m in members]),
        learning_rate=np.array([m.learning_rate for m in members]),
        gaussian=np.array([m.mechanism.family == "gaussian" for m in members]),
    )


def _mesh(devices) -> tuple[tuple[Any, ...], NamedSharding]:
    devices = tuple(jax.devices() if devices is None else devices)
    if not devices:
        raise InvalidParameterError("devices=() is invalid: give at least one device")
    mesh = Mesh(np.asarray(devices, dtype=object), (MEMBER_AXIS,))
    return devices, NamedSharding(mesh, PartitionSpec(MEMBER_AXIS))


# --------------------------------------------------------------------------------------------------
# Held-out evaluation and the result table
# --------------------------------------------------------------------------------------------------


def _spec_trainer(spec: AdversarySpec, static: _Static) -> Trainer:
    """The trainer that initialises members of ``spec`` (same shapes and step as the group's)."""
    # Initialisation does not depend on the training form, so tight is irrelevant here.
    return cached_trainer(spec, _divergence(static), dim=static.dim, dtype=jnp.dtype(static.dtype))


def _model_static(static: _Static) -> _Static:
    """The static fields that initialisation and evaluation depend on.

    The model and the noise, not the training budget: a new budget must not recompile them.
    """
    return static._replace(blocks=0, block_steps=0, batch_size=0, val_samples=0, shared_noise=False)


def _check_max_batch(max_batch: int) -> int:
    return check_int_at_least("max_batch", max_batch, 1)
