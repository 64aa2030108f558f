"""The sweep's compiled programs: a batch of members trained and evaluated with ``jax.vmap``.

Every member draws its fresh samples inside the step (the noise family and scale, the sensitivity,
alpha and the learning rate are traced arrays: changing them never recompiles); :func:`_train_batch`
trains with early stopping and fits the critic in closed form, :func:`_member_evaluate` streams its
held-out chunks. The ``_*_program`` functions are the jitted entry points, whose bodies are looked
up when traced (tests count traces on them).

References:
  docs/theory/bounds.md.

"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from cbdp_jax._src.estimator.adversary_fitting_ensemble import (
    apply_fn,
    early_stopping_scan,
    shared_counts,
    state_axes,
)
from cbdp_jax._src.estimator.certification import shrink_for_tails_traced
from cbdp_jax._src.estimator.core import (
    Trainer,
    TrainState,
    closed_form_fit,
    set_learning_rate,
)
from cbdp_jax._src.estimator.core import fit as core_fit
from cbdp_jax._src.estimator.sweep_types import (
    FIT_INDEX,
    MemberInputs,
    MemberTraining,
    _divergence,
    _Static,
)
from cbdp_jax._src.mechanisms import (
    canonical_pair_from_uniforms,
    pair_uniforms,
)
from cbdp_jax._src.statistics import berry_esseen, selection, tails
from cbdp_jax._src.statistics import moments as mom

# --------------------------------------------------------------------------------------------------
# Per-member programs
# --------------------------------------------------------------------------------------------------


def _standardisation(static: _Static, inp: MemberInputs):
    """Population mean and standard deviation of the pooled sample (P and Q in equal parts)."""
    dt = jnp.dtype(static.dtype)
    scale, v = inp.noise_scale.astype(dt), inp.sensitivity.astype(dt)
    laplace_var, gauss_var = 2.0 * scale**2, scale**2
    if static.family == "laplace":
        var = laplace_var
    elif static.family == "gaussian":
        var = gauss_var
    else:
        var = jnp.where(inp.gaussian, gauss_var, laplace_var)
    return v / 2.0, jnp.sqrt(var + v**2 / 4.0)


def _uniform(static: _Static, key, n: int) -> jax.Array:
    """Uniforms for ``n`` samples of each side (:func:`~cbdp_jax._src.mechanisms.pair_uniforms`)."""
    return pair_uniforms(key, n, static.dim, static.dtype)


def _place(static: _Static, u: jax.Array, inp: MemberInputs) -> jax.Array:
    """Samples of P = M(0) and Q = M(v), ``[2, n, d]``, with the member's noise from uniforms ``u``."""
    return canonical_pair_from_uniforms(
        u,
        family=static.family,
        gaussian=inp.gaussian,
        noise_scale=inp.noise_scale,
        sensitivity=inp.sensitivity,
    )


def _draw_pair(static: _Static, key, n: int, inp: MemberInputs) -> jax.Array:
    """``n`` fresh samples of P and of Q, ``[2, n, d]``, with the member's noise scale."""
    return _place(static, _uniform(static, key, n), inp)


def _outputs(static: _Static, params, rest, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The adversary on both sides ``x [2, n, d]`` in one pass (fewer, larger matrix products)."""
    n = x.shape[1]
    h = apply_fn(static.graphdef, params, rest, x.reshape(2 * n, x.shape[2]))
    return h[:n], h[n:]


def _member_keys(static: _Static, key_data) -> tuple[jax.Array, jax.Array, jax.Array]:
    key = jax.random.wrap_key_data(key_data, impl=static.key_impl)
    k_init, k_val, k_train = jax.random.split(key, 3)
    return k_init, k_val, k_train


def _train_batch(
    static: _Static, inputs: MemberInputs, state: TrainState, noise_key_data, z
) -> MemberTraining:
    """Trains a batch of members on fresh minibatches with early stopping; see the module docstring.

    The core's ``step`` and ``value`` (:mod:`cbdp_jax._src.estimator.core`, the estimator's too), vmapped over the
    members with each member's order alpha and step size traced, inside
    :func:`~cbdp_jax._src.estimator.adversary_fitting_ensemble.early_stopping_scan`. With ``static.shared_noise`` the step's
    standard noise is drawn once, outside the vmap, and every member scales it by its own noise scale.
    """
    trainer, div = static.trainer, _divergence(static)
    dt = jnp.dtype(static.dtype)
    _, k_val, k_train = jax.vmap(functools.partial(_member_keys, static))(inputs.key_data)
    val_x = jax.vmap(lambda k, inp: _draw_pair(static, k, static.val_samples, inp))(k_val, inputs)
    # The closed-form fit uses its own draw from the training stream (an index no step reaches).
    fit_x = jax.vmap(
        lambda k, inp: _draw_pair(static, jax.random.fold_in(k, FIT_INDEX), static.val_samples, inp)
    )(k_train, inputs)
    noise_key = jax.random.wrap_key_data(noise_key_data, impl=static.key_impl)
    state = state._replace(
        opt_state=shared_counts(set_learning_rate(state.opt_state, inputs.learning_rate))
    )
    axes = state_axes(trainer, state)

    def member_step(st, inp, k, noise, i):
        if noise is None:
            x = _draw_pair(static, jax.random.fold_in(k, i), static.batch_size, inp)
        else:
            x = _place(static, noise, inp)
        st, info = trainer.step(k, st, (x[0], x[1]), inp.alpha.astype(dt))
        return st, info.value

    vstep = jax.vmap(member_step, in_axes=(axes, 0, 0, None, None), out_axes=(axes, 0))
    vvalue = jax.vmap(
        lambda st, inp, x: trainer.value(st, (x[0], x[1]), inp.alpha.astype(dt)),
        in_axes=(axes, 0, 0),
    )

    def step(st, i):
        noise = None
        if static.shared_noise:
            noise = _uniform(static, jax.random.fold_in(noise_key, i), static.batch_size)
        return vstep(st, inputs, k_train, noise, i)

    best_p, best_v, finite, train_c, val_c = early_stopping_scan(
        step,
        lambda st: vvalue(st, inputs, val_x),
        state,
        jnp.arange(static.blocks * static.block_steps).reshape(static.blocks, static.block_steps),
    )

    def member_fit(p_, r_, inp, xf, xv):
        return core_fit(
            trainer, div, p_, r_, (xf[0], xf[1]), (xv[0], xv[1]), z, inp.alpha.astype(dt)
        )

    def member_plain(p_, r_, inp, xf):
        return closed_form_fit(trainer, div, p_, r_, (xf[0], xf[1]), inp.alpha.astype(dt))

    rest = state.rest
    scale, shift = jax.vmap(member_fit)(best_p, rest, inputs, fit_x, val_x)
    plain = jax.vmap(member_plain)(best_p, rest, inputs, fit_x)

    # The class's raw outputs on the validation samples, once: the shrink and the statistics use them.
    hv_p, hv_q = jax.vmap(functools.partial(_outputs, static))(best_p, rest, val_x)
    shrink = jnp.ones_like(scale)
    if static.tail_need > 0:

        def member_shrink(inp, hp, hq, hf_q, sc, sh):
            return shrink_for_tails_traced(
                div,
                inp.alpha.astype(dt),
                static.objective,
                h_val_p=hp,
                h_val_q=hq,
                h_fit_q=hf_q,
                scale=sc,
                shift=sh,
                need=static.tail_need,
            )

        hf_q = jax.vmap(trainer.apply)(best_p, rest, fit_x[:, 1])
        scale, shift, shrink = jax.vmap(member_shrink)(inputs, hv_p, hv_q, hf_q, scale, shift)

    def validation_stats(inp, hp, hq, sc, sh):
        t_p = sc * hp + sh
        t_q = div.conjugate(sc * hq + sh, inp.alpha.astype(dt))
        z_val = t_p - t_q
        # Tail-sketch centres as certification.centres_of: the median of h(X), inf f* for f*(h(Y)).
        inf_q = jnp.asarray(div.conjugate_inf(inp.alpha.astype(dt)), t_p.dtype)
        centre = jnp.stack([selection.median(t_p), inf_q])
        return centre, (mom.of(z_val), berry_esseen.pair_moments(z_val))

    cent, val_z = jax.vmap(validation_stats)(inputs, hv_p, hv_q, scale, shift)
    return MemberTraining(
        best_p, rest, scale, shift, best_v, finite, train_c.T, val_c.T, cent, val_z, shrink, plain
    )


def _member_evaluate(
    static: _Static,
    chunk: int,
    keep: bool,
    inp,
    test_key_data,
    params,
    rest,
    scale,
    shift,
    centres,
    plain,
    index,
    n_valid,
):
    """Held-out statistics of the two f-form terms on one chunk of fresh samples (one member).

    The certified critic ``scale * h + shift`` gives every statistic of the bound; the closed-form
    critic ``plain`` only the moments of its terms (the row's estimate).
    """
    key = jax.random.wrap_key_data(test_key_data, impl=static.key_impl)
    h_p, h_q = _outputs(
        static, params, rest, _draw_pair(static, jax.random.fold_in(key, index), chunk, inp)
    )
    conjugate = _divergence(static).conjugate
    alpha = inp.alpha.astype(h_q.dtype)
    t_p = scale * h_p + shift
    t_q = conjugate(scale * h_q + shift, alpha)
    mask = jnp.arange(chunk) < n_valid
    z = jnp.where(mask, t_p - t_q, 0.0)
    named_p = plain[0] * h_p + plain[1]
    named_q = conjugate(plain[0] * h_q + plain[1], alpha)
    out = (
        mom.of(t_p, mask),
        mom.of(t_q, mask),
        mom.of(z, mask),
        berry_esseen.pair_moments(z, mask),
        tails.sketch(t_p, centres[0], tails.DEFAULT_CAPACITY, mask),
        tails.sketch(t_q, centres[1], tails.DEFAULT_CAPACITY, mask),
        mom.of(named_p, mask),
        mom.of(named_q, mask),
    )
    return out + ((z,) if keep else ())


# --------------------------------------------------------------------------------------------------
# Compiled programs (vmapped over members)
# --------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("trainer", "static"))
def _init_program(inputs: MemberInputs, **statics) -> TrainState:
    """The compiled initialisation program: :func:`_init_body`, looked up when traced.

    Every compiled program here calls its body through a module global, so a test can wrap the body
    with ``chex.assert_max_traces`` (a body runs only when its program is traced).
    """
    return _init_body(inputs, **statics)


def _init_body(inputs: MemberInputs, *, trainer: Trainer, static: _Static) -> TrainState:

    def one(inp):
        k_init, _, _ = _member_keys(static, inp.key_data)
        loc, std = _standardisation(static, inp)
        return trainer.init_standardised(k_init, loc, std)

    return jax.vmap(one)(inputs)


@jax.jit
def _select_members(index, trees):
    """Per member, the tree ``trees[index[m]]`` (classes of one shape initialised separately)."""

    def pick(*leaves):
        out = leaves[0]
        for j, leaf in enumerate(leaves[1:], start=1):
            m = (index == j).reshape(index.shape + (1,) * (leaf.ndim - 1))
            out = jnp.where(m, leaf, out)
        return out

    return jax.tree.map(pick, *trees)


@functools.partial(jax.jit, static_argnames=("static",))
def _train_program(
    inputs: MemberInputs, state: TrainState, noise_key_data, z, *, static: _Static
) -> MemberTraining:
    return _train_batch(static, inputs, state, noise_key_data, z)


@functools.partial(jax.jit, static_argnames=("static", "chunk", "keep"))
def _evaluate_program(
    inputs: MemberInputs,
    test_key_data,
    output: MemberTraining,
    index,
    n_valid,
    *,
    static,
    chunk,
    keep=False,
):
    fn = functools.partial(_member_evaluate, static, chunk, keep)
    return jax.vmap(fn, in_axes=(0, 0, 0, 0, 0, 0, 0, 0, None, None))(
        inputs,
        test_key_data,
        output.params,
        output.rest,
        output.scale,
        output.shift,
        output.centres,
        output.plain,
        index,
        n_valid,
    )
