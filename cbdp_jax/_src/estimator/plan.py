"""The estimator's plan: everything fixed before any adversary is trained.

The class and the divergence from their names, the budget (:func:`_resolved`), the samples drawn from a
mechanism or split from a user's arrays into train / validation / test parts, the candidate input maps
fitted on the training samples, and one :class:`_Problem` per direction and map: the data access,
class, trainer and objective that :mod:`estimator_fit` trains and :mod:`estimator_certify` evaluates.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.estimator import input_maps
from cbdp_jax._src.estimator.adversaries import AdversarySpec, CustomAdversary, make_adversary
from cbdp_jax._src.estimator.adversary_fitting_ensemble import (
    bucket_rows,
    pad_validation,
    standardisation,
)
from cbdp_jax._src.estimator.budget import (
    derived_fields,
    resolve_budget,
)
from cbdp_jax._src.estimator.core import Trainer, cached_trainer
from cbdp_jax._src.estimator.types import EstimatorConfig
from cbdp_jax._src.infra import keys, sizes, threads
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_int_at_least,
)
from cbdp_jax._src.privacy.divergences import Divergence


def _as_spec(adversary: AdversarySpec | CustomAdversary | str, options: dict[str, Any]):
    if isinstance(adversary, (AdversarySpec, CustomAdversary)):
        given = {k: v for k, v in options.items() if v is not None}
        if given:
            option, value = next(iter(given.items()))
            raise InvalidParameterError(
                f"{option}={value!r} is invalid with adversary={adversary.label!r}: options complete "
                "a class given by name; set them on the AdversarySpec instead"
            )
        return adversary
    if isinstance(adversary, str):
        return make_adversary(adversary, **options)
    raise InvalidParameterError(
        f"adversary={adversary!r} is invalid: must be an AdversarySpec, a CustomAdversary (a user's "
        "nnx.Module class with declared properties) or a class name"
    )


def _trainer(spec: AdversarySpec, div: Divergence, dim: int, config: EstimatorConfig) -> Trainer:
    """The class's pure training functions, built once per (class, divergence, optimiser)."""
    return cached_trainer(
        spec,
        div,
        dim=dim,
        optimizer=config.optimizer,
        tight=config.tight,
        dtype=jnp.dtype(config.dtype),
    )


def _key_data(key: jax.Array) -> list[int]:
    return np.asarray(jax.random.key_data(key)).ravel().tolist()


class _Problem:
    """Everything one direction of an estimate needs: data access, class, objective."""

    def __init__(
        self,
        *,
        spec: AdversarySpec,
        divergence: Divergence,
        trainer: Trainer,
        config: EstimatorConfig,
        dim: int,
        train: tuple[np.ndarray, np.ndarray] | None,
        val: tuple[np.ndarray, np.ndarray],
        test_chunks: Callable[[], tuple[Iterator[jax.Array], Iterator[jax.Array]]],
        n_test: tuple[int, int],
        sampler: Callable | None = None,
        stats_sample: tuple[np.ndarray, np.ndarray],
        named_class: str | None = None,
        input_map: input_maps.InputMap = input_maps.IDENTITY,
        map_choice: str = "asked for",
    ):
        self.spec, self.divergence, self.trainer = spec, divergence, trainer
        # The fixed map the samples went through (fitted on training samples) and why it was used.
        self.input_map, self.map_choice = input_map, map_choice
        # The class the user named (the trained ``spec`` may be a subset of it: kl_domain_reduction).
        self.named_class = spec.label if named_class is None else named_class
        self.config, self.dim = config, dim
        # Host arrays of the samples (training None in fresh-sample mode).
        self.train, self.val, self.test_chunks, self.n_test = train, val, test_chunks, n_test
        self.sampler, self.stats_sample = sampler, stats_sample
        # Training's validation checks use the first CHECK_PAIRS validation pairs at most, padded to a
        # bucket of rows and put on the device once.
        self.val_padded, self.val_counts = pad_validation(*(x[:CHECK_PAIRS] for x in val))
        # The input standardisation of every member, from the pooled sample (training samples).
        self.standardisation = standardisation(stats_sample, jnp.dtype(config.dtype))

    @property
    def fit_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples the closed-form fit uses: the training samples (or the reference draw)."""
        return self.train if self.train is not None else self.stats_sample


# Training's validation checks (the stopping point, the ensemble member, the input-map screen) use
# the first this many validation pairs at most (a random subsample: the samples are shuffled or
# i.i.d. draws); the fit, the plan of the bound and every other choice made on validation samples
# use them all. At 10^6 samples per side (250,000 validation pairs) the checks took a third of a
# warm estimate; the objective's standard error on 16,384 pairs is a few thousandths of its value.
CHECK_PAIRS = 1 << 14


def _known_infinite(pair, spec: AdversarySpec, div) -> str | None:
    """Why D^H is +inf for this pair and class, from the mechanism's law (never from samples)."""
    from cbdp_jax._src.mechanisms import NonPrivateRelease

    if not isinstance(pair.mechanism, NonPrivateRelease):
        return None
    if spec.bound is not None or div.conjugate_sup < math.inf:
        return None  # bounded critics, or f* with a bounded domain: a finite value
    key = jax.random.key(0)  # a point mass: the draw does not depend on the key
    a, b = pair.sample(key, 1)
    if np.array_equal(np.asarray(a), np.asarray(b)):
        return None  # the same point mass on both sides: P = Q
    return (
        "the mechanism is a NonPrivateRelease: its outputs on D and D' are two distinct point "
        "masses, so the divergence is +inf for any unbounded class that separates them (paper "
        "Lemma 2); this comes from the mechanism's law, not from samples"
    )


# From this many samples per side the two sides are shuffled in two threads (below it a thread costs
# more than the sort).
_SPLIT_THREADS = 50_000


def _split(name: str, arr: np.ndarray, key: jax.Array, config: EstimatorConfig):
    """``arr`` shuffled by ``key`` and cut into (train, validation, test) by ``config.split`` (host arrays)."""
    fracs = config.split
    need = math.ceil(2 / min(fracs))
    n = arr.shape[0]
    if n < need:
        raise InvalidParameterError(
            f"{name} has {n} samples: the split {fracs} needs at least {need} per side (two in each "
            "of train, validation and test)"
        )
    idx = keys.permutation(key, n)  # = jax.random.permutation(key, n), sorted on the host
    n_tr, n_va = int(fracs[0] * n), int(fracs[1] * n)
    x = arr[idx]
    return x[:n_tr], x[n_tr : n_tr + n_va], x[n_tr + n_va :]


def _fitted_maps(config: EstimatorConfig, train_p, train_q) -> tuple[list, str]:
    """The candidate maps of ``config.input_map``, fitted on the pooled training samples; and why.

    ``train_p`` and ``train_q`` are host arrays of the TRAINING samples only: the maps never see
    validation or test samples, so the bound evaluated through them stays valid.
    """
    names, why = input_maps.candidates(
        config.input_map, train_p, train_q, class_bound=config.guarantee == "class"
    )
    return [input_maps.fit(name, train_p, train_q) for name in names], why


def _mapped_candidates(config: EstimatorConfig, p_host: tuple, q_host: tuple) -> tuple[list, str]:
    """Per candidate input map, ``(map, mapped P parts, mapped Q parts)``; and why these maps.

    Each map is fitted on the pooled training parts only and applied to all three parts; the maps
    and sides are applied in threads (NumPy releases the GIL in the rank map's search), the same
    arrays as one after the other.
    """
    maps, why = _fitted_maps(config, p_host[0], q_host[0])
    jobs = [(m, parts, config) for m in maps for parts in (p_host, q_host)]
    # The identity alone (ordinary samples) is two array copies: no threads for them.
    mapping = any(m.kind != "standard" for m in maps)
    done = threads.map_concurrently(_mapped, jobs, concurrent=mapping)
    return [(m, done[2 * i], done[2 * i + 1]) for i, m in enumerate(maps)], why


def _mapped(imap: input_maps.InputMap, parts: tuple, config: EstimatorConfig) -> tuple:
    """Host parts through the fitted input map, as host arrays of the configured dtype.

    Cast on the host (an eager cast would compile a program per shape); the programs that use them
    take padded copies (training, validation) or fixed-size pieces (outputs, evaluation).
    """
    dtype = jnp.dtype(config.dtype)
    return tuple(np.asarray(imap(x), dtype) for x in parts)


def _mechanism_problem(
    pair, swap: bool, *, spec, div, config, train, val, k_test, test_samples: int,
    fresh_samples: bool, named_class: str, input_map: tuple = (input_maps.IDENTITY, "asked for"),
) -> _Problem:  # fmt: skip
    """One direction of a mechanism estimate: drawn training / validation samples, streamed tests."""
    mech, dtype = pair.mechanism, jnp.dtype(config.dtype)
    d_a, d_b = (pair.dataset, pair.neighbour) if not swap else (pair.neighbour, pair.dataset)
    tr = train if not swap else (train[1], train[0])
    va = val if not swap else (val[1], val[0])
    kp, kq = keys.split(keys.fold_in(k_test, int(swap)))
    chunk = config.eval_chunk
    imap, choice = input_map
    dim = va[0].shape[1]  # the mapped dimension (the rank map adds atom indicators)
    return _Problem(
        spec=spec,
        divergence=div,
        trainer=_trainer(spec, div, dim, config),
        config=config,
        dim=dim,
        train=None if fresh_samples else tr,
        val=va,
        test_chunks=lambda: (
            _mapped_chunks(imap, _sample_chunks(mech, d_a, kp, test_samples, chunk, dtype), dtype),
            _mapped_chunks(imap, _sample_chunks(mech, d_b, kq, test_samples, chunk, dtype), dtype),
        ),
        n_test=(test_samples, test_samples),
        sampler=None if not fresh_samples else _pair_sampler(pair, swap),
        stats_sample=tr,
        named_class=named_class,
        input_map=imap,
        map_choice=choice,
    )


def _mapped_chunks(imap: input_maps.InputMap, chunks: Iterator, dtype) -> Iterator:
    """Test chunks through the input map (on the host); the identity passes them through untouched."""
    if imap.kind == "standard":
        yield from chunks
        return
    for c in chunks:
        yield np.asarray(imap(np.asarray(c)), dtype)


def _mechanism_maps(config: EstimatorConfig, train, val, *, fresh_samples: bool) -> list:
    """``[(input map, why), (mapped train, mapped val)]`` per candidate map of a mechanism estimate.

    Maps are fitted on the drawn training samples; in fresh-sample mode the training minibatches are
    drawn inside the compiled loop, where no host map applies, so only the standard map is possible.
    """
    if fresh_samples:
        return [((input_maps.IDENTITY, "fresh samples: the standard map"), (train, val))]
    maps, why = _fitted_maps(config, *train)
    out = []
    for imap in maps:
        if imap.kind == "standard":
            out.append(((imap, why), (train, val)))
            continue
        out.append(((imap, why), tuple(_mapped(imap, part, config) for part in (train, val))))
    return out


def _counts(train: tuple, val: tuple, test: tuple) -> dict[str, int]:
    """The per-side sample counts of a result, from (P, Q) pairs."""
    return {
        f"{part}_{side}": int(n)
        for part, pair in (("train", train), ("val", val), ("test", test))
        for side, n in zip("pq", pair, strict=True)
    }


def _config_dict(config: EstimatorConfig, entry: str = "samples") -> dict[str, Any]:
    """The configuration settings that applied to an estimate.

    ``split`` applies only to :func:`estimate_from_samples` (``entry='samples'``): a mechanism estimate
    draws its train / validation / test samples separately and records their counts instead.
    """
    d = dataclasses.asdict(config)
    d.pop("progress")
    if not isinstance(config.optimizer, str):
        d["optimizer"] = f"custom {type(config.optimizer).__name__}"
    if entry == "samples":
        d["split"] = list(config.split)
    else:
        d.pop("split")
    return d


def _frozen(tree) -> tuple:
    """A hashable fingerprint of a dataset (a pytree of numbers or arrays): shapes, dtypes, bytes."""
    leaves, treedef = jax.tree.flatten(tree)
    return (
        str(treedef),
        tuple((np.shape(x), str(np.asarray(x).dtype), np.asarray(x).tobytes()) for x in leaves),
    )


_SAMPLERS: dict[tuple, Callable] = {}


def _pair_sampler(pair, swap: bool) -> Callable:
    """A stable ``(key, n) -> (p, q)`` for a pair.

    Equal pairs get the same function object, so the compiled training program (which takes it as a
    static argument) is reused, not retraced.
    """
    fingerprint = (pair.mechanism, _frozen(pair.dataset), _frozen(pair.neighbour), swap)
    if fingerprint not in _SAMPLERS:
        _SAMPLERS[fingerprint] = (pair.swapped() if swap else pair).sample
    return _SAMPLERS[fingerprint]


def _prefix_stable(mechanism) -> bool:
    """Whether the first n of N draws of ``mechanism`` under one key are its n draws under that key.

    True for the Laplace and Gaussian mechanisms under partitionable threefry (JAX's default): each
    output entry is a function of the key and its own counter, so a draw of N rows starts with the
    draw of n (``tests/test_estimator.py`` checks it). Their samples are then drawn for a bucket of
    rows and cut on the host: one compiled sampler serves every sample size.
    """
    from cbdp_jax._src.mechanisms import GaussianMechanism, LaplaceMechanism

    return type(mechanism) in (LaplaceMechanism, GaussianMechanism) and bool(
        jax.config.jax_threefry_partitionable
    )


# Prefix-stable mechanisms draw training and validation samples for a power-of-two bucket of rows
# from this many (the held-out chunks' default size: one sampler program for all of them).
_MIN_DRAW_ROWS = 1 << 16


def _draw_rows(
    mechanism, key: jax.Array, dataset, n: int, dtype, rows: int | None = None
) -> np.ndarray:
    """``np.asarray(mechanism.sample(key, dataset, n))``, drawn for ``rows`` rows where that is the same.

    ``rows`` defaults to the bucket of ``n`` (:data:`_MIN_DRAW_ROWS` at least) for a prefix-stable
    mechanism (:func:`_prefix_stable`), else ``n``.
    """
    if not _prefix_stable(mechanism):
        rows = n
    elif rows is None:
        rows = bucket_rows(n, _MIN_DRAW_ROWS)
    return np.asarray(mechanism.sample(key, dataset, max(rows, n), dtype=dtype))[:n]


def _draw_pair(pair, key: jax.Array, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``pair.sample(key, n)`` as host arrays (:func:`_draw_rows` of each side, its keys split alike)."""
    k_p, k_q = keys.split(key)
    mech = pair.mechanism
    return _draw_rows(mech, k_p, pair.dataset, n, dtype), _draw_rows(
        mech, k_q, pair.neighbour, n, dtype
    )


def _sample_chunks(mechanism, dataset, key: jax.Array, n: int, chunk: int, dtype) -> Iterator:
    """Streams ``n`` samples of M(dataset) in chunks (host arrays); chunk i uses ``fold_in(key, i)``.

    A prefix-stable mechanism draws every chunk at ``chunk`` rows (the last one cut): one compiled
    sampler serves every test size.
    """
    dtype = jnp.dtype(dtype)
    for i, start in enumerate(range(0, n, chunk)):
        m = min(chunk, n - start)
        yield _draw_rows(mechanism, keys.fold_in(key, i), dataset, m, dtype, rows=chunk)


def _as_pair(pair: Any):
    """A :class:`~cbdp_jax.mechanisms.NeighbouringPair` (a mechanism stands for its canonical pair)."""
    from cbdp_jax._src.mechanisms import Mechanism, NeighbouringPair, canonical_pair

    if isinstance(pair, Mechanism):
        pair = canonical_pair(pair)
    if not isinstance(pair, NeighbouringPair):
        raise InvalidParameterError(
            f"pair={pair!r} is invalid: must be a NeighbouringPair or a Mechanism"
        )
    return pair


def _sample_sizes(samples: Any, val_samples: Any, test_samples: Any) -> tuple[int, int, int]:
    """Training, validation and test samples per side, checked (defaults max(samples // 4, 1000), samples)."""
    samples = check_int_at_least("samples", samples, 2)
    val_samples = max(samples // 4, 1000) if val_samples is None else val_samples
    val_samples = check_int_at_least("val_samples", val_samples, 2)
    test_samples = samples if test_samples is None else test_samples
    test_samples = check_int_at_least("test_samples", test_samples, 2)
    return samples, val_samples, test_samples


def _resolved(
    config: EstimatorConfig, n_train: int, *, pair=None, val_samples: int = 0
) -> tuple[EstimatorConfig, dict[str, Any]]:
    """The configuration with its derived budget (:func:`resolve_budget`), and what was derived.

    With a mechanism's ``pair``, first checks that its training and validation draws fit in memory.
    """
    if pair is not None:
        sizes.check_memory_for_draws(pair, n_train, val_samples, config, jnp.dtype(config.dtype))
    derived = derived_fields(config)
    out = resolve_budget(config, n_train)
    return out, {"derived": derived, "n_train": int(n_train), "rule": "default_budget"}
