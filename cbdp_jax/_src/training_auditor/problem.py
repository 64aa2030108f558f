"""What one audited DP training is: the model, the data, the DP step, the canary and the relation.

A :class:`TrainingProblem` is a frozen value: the runs of an audit differ only by their keys. Its
data set D is the data plus the canary; its neighbour D' depends on ``relation``
(docs/theory/training_audit.md, section 1):

* ``'add-remove'`` (dp_accounting's default, ``ADD_OR_REMOVE_ONE``): D' has no canary at all, in no
  batch and not in the data set's size; a step built per data set gets n + 1 on D and n on D'.
* ``'zero-out'`` (``REPLACE_SPECIAL``): D' keeps the canary's slot, with a zero gradient; it counts
  in the batch and in the data set's size.
* ``'replace-one'`` (``REPLACE_ONE``): the canary replaces one fixed record: a data example
  (``Canary.replaces``; an input canary's default is the data's last example) or, for a gradient
  canary by default, the opposite gradient canary (the worst case of a clipped sum).

Every input is checked before training, each failure one line naming the problem and the share of
examples affected: non-finite features or labels, and, with the default classification loss,
non-integer labels or labels outside the model's classes (:func:`check_labels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import optax
from flax import nnx

from cbdp_jax._src.infra.user_code import describe
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_int_at_least,
    check_positive,
)
from cbdp_jax._src.privacy.accounting import RELATIONS
from cbdp_jax._src.training_auditor.batch_sampling import BatchSampler

THREATS = ("gradient", "white-box", "black-box")
SCORES = ("auto", "llr", "sum")
DEFAULT_CANARY_NORM = 4.0  # the gradient canary's norm in units of the clipping norm


@dataclasses.dataclass(frozen=True, kw_only=True)
class Canary:
    """The example whose membership is audited.

    Attributes:
      kind: ``'gradient'`` (a gradient canary: a fixed per-example gradient) or ``'input'`` (an extra
        example (x, y) whose gradient the model computes).
      norm: The gradient canary's l2 norm. None: ``DEFAULT_CANARY_NORM`` (4) times the problem's
        ``l2_norm_clip`` (4 when that is not given), so that clipping binds on it and a step that
        does not clip is seen.
      coordinate: The flat parameter index the gradient canary points along; None picks the first
        coordinate that no example's gradient moves (exact law), else the least-moved one.
      x: The input canary's features ``[d]``.
      y: The input canary's label.
      replaces: Under ``relation='replace-one'``: the index of the data example the canary replaces.
        None: an input canary replaces the data's last example; a gradient canary replaces the
        opposite gradient canary (norm ``norm`` pointing the other way).

    """

    kind: str = "gradient"
    norm: float | None = None
    coordinate: int | None = None
    x: Any = None
    y: Any = None
    replaces: int | None = None

    def __post_init__(self):
        check_choice("canary kind", self.kind, ("gradient", "input"))
        if self.norm is not None:
            check_positive("canary norm", self.norm)
        if self.kind == "input" and (self.x is None or self.y is None):
            raise InvalidParameterError("canary=None is invalid: an input canary needs x and y")
        if self.replaces is not None:
            check_int_at_least("canary replaces", self.replaces, 0)


def cross_entropy(model, x, y):
    """The default loss: softmax cross-entropy of ``model(x)`` (logits ``[b, classes]``) and labels ``[b]``."""
    return optax.losses.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingProblem:
    """Everything one audited training run needs (the runs differ only by their keys).

    Attributes:
      model: A Flax NNX module mapping a batch of features ``[b, d]`` to outputs; split once.
      data: ``(X [n, d], y [n] or [n, k])``: integer labels for the default loss, any finite numbers
        for one's own ``loss_fn``.
      step: The DP step: an ``optax.GradientTransformation`` whose ``update`` receives per-example
        gradients along a padded leading axis of fixed length, the sampler's ``capacity`` (the
        physical batch, so that shapes are static under jit): each slot holds one example's
        gradient, and a slot that holds no example of this step's batch is all zeros. Only an
        ``optax.GradientTransformationExtraArgs`` (as :func:`dp_sgd`, ``optax.chain`` and
        ``optax.contrib.dpsgd`` are) is also passed ``batch_mask``, bool ``[capacity]``, the slots
        that hold an example (a zeroed canary's slot under zero-out included); a plain
        ``GradientTransformation`` is not. Or a factory ``step(size)`` returning one for a data
        set of ``size`` examples (built per data set: add/remove gives D n + 1, D' n). A step that
        divides by the expected batch size should use the sampler's over D's examples, canary
        included: q (n + 1) for n data examples under Poisson sampling (``expected_batch_size=8``
        for 63 examples at q = 0.125), the same constant on D and D', as the accountant assumes.
      sampler: The :class:`BatchSampler`, over D's examples (canary included: its rate q applies
        to n + 1 examples, or n when the canary replaces one).
      steps: T, the number of training steps.
      canary: The :class:`Canary`.
      threat: ``'gradient'``, ``'white-box'`` or ``'black-box'``.
      noise_multiplier: The run's claimed S (the ``'llr'`` score and the default claim use it).
      l2_norm_clip: The run's clipping norm C, if known: the default gradient canary is 4 C.
      relation: ``'add-remove'``, ``'zero-out'``, ``'replace-one'`` or None: the relation of the
        claim's accountant (add-remove, dp_accounting's default, when the claim names none).
      loss_fn: ``loss_fn(model, x, y)`` on a batch of one example (``x [1, d]``, ``y [1, ...]``),
        returning a scalar; None is :func:`cross_entropy` with integer labels.
      score: ``'llr'`` or ``'sum'`` for the gradient threat (``'auto'``: llr when S is known), or a
        function ``score(z)`` of the canary coordinates ``z [T]`` returning a scalar, traceable by
        JAX (e.g. the exact log-likelihood ratio of a data set whose gradients are known).
      chunk: Runs vmapped at once inside the program (memory bound).
      name: The mechanism's name in the audit's messages.

    """

    model: nnx.Module
    data: tuple[Any, Any]
    step: Any
    sampler: BatchSampler
    steps: int
    canary: Canary = Canary()
    threat: str = "gradient"
    noise_multiplier: float | None = None
    l2_norm_clip: float | None = None
    relation: str | None = None
    loss_fn: Callable | None = None
    score: str | Callable = "auto"
    chunk: int = 2048
    name: str = "training"

    def __post_init__(self):
        if not isinstance(self.sampler, BatchSampler):
            raise InvalidParameterError("sampler is invalid: must be a BatchSampler")
        check_int_at_least("steps", self.steps, 1)
        check_int_at_least("chunk", self.chunk, 1)
        check_choice("threat", self.threat, THREATS)
        if not callable(self.score):
            check_choice("score", self.score, SCORES)
        if self.relation is not None:
            check_choice("relation", self.relation, RELATIONS)
        for name in ("noise_multiplier", "l2_norm_clip"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise InvalidParameterError(
                "loss_fn is invalid: must be a function loss_fn(model, x, y) -> scalar"
            )
        want = "a gradient" if self.threat == "gradient" else "an input"
        if self.canary.kind != want.split()[1]:
            raise InvalidParameterError(
                f"canary={self.canary.kind!r} is invalid: threat {self.threat!r} needs {want} canary"
            )
        x, y = check_data(self.data, default_loss=self.loss_fn is None)
        if self.canary.kind == "input":
            check_input_canary(self.canary, x, default_loss=self.loss_fn is None)
        self._check_replaces(x.shape[0])
        self.sampler.check_size(self.examples)
        if self.audited_relation == "add-remove":
            self.sampler.check_size(self.neighbour_examples, what="D' under add-remove, no canary")
        self.step_for(self.examples)  # a factory is called once here, to check what it returns

    def _check_replaces(self, n: int) -> None:
        index = self.canary.replaces
        if index is not None and self.audited_relation != "replace-one":
            raise InvalidParameterError(
                f"canary replaces={index} is invalid with relation={self.audited_relation!r}: "
                "only replace-one replaces an example"
            )
        if index is not None and index >= n:
            raise InvalidParameterError(
                f"canary replaces={index} is invalid: must index one of the {n} examples [0, {n - 1}]"
            )
        if self.replaced_index is not None and n < 2:
            raise InvalidParameterError(
                "data is invalid with relation='replace-one': the canary replaces one of at least 2 "
                "examples"
            )

    @property
    def audited_relation(self) -> str:
        """The relation the runs use: ``relation``, or add-remove when it is None."""
        return self.relation or "add-remove"

    @property
    def replaced_index(self) -> int | None:
        """The data example the canary replaces under replace-one (None: none, or the opposite canary)."""
        if self.audited_relation != "replace-one":
            return None
        if self.canary.replaces is not None:
            return int(self.canary.replaces)
        return int(np.shape(self.data[0])[0]) - 1 if self.canary.kind == "input" else None

    @property
    def examples(self) -> int:
        """The number of examples of D: the n data and the canary (n when it replaces one of them)."""
        n = int(np.shape(self.data[0])[0])
        return n if self.replaced_index is not None else n + 1

    @property
    def neighbour_examples(self) -> int:
        """The number of examples of D': one fewer under add/remove, else as many as D."""
        return self.examples - 1 if self.audited_relation == "add-remove" else self.examples

    @property
    def sampling_rate(self) -> float:
        """The sampler's rate q over D's examples."""
        return self.sampler.sampling_rate(self.examples)

    def step_for(self, size: int) -> optax.GradientTransformation:
        """The step of a data set of ``size`` examples: ``step`` itself, or what its factory builds."""
        if isinstance(self.step, optax.GradientTransformation):
            return self.step
        if not callable(self.step):
            raise InvalidParameterError(
                f"step={type(self.step).__name__} is invalid: must be an optax.GradientTransformation "
                "(init, update) applied to per-example gradients, or a factory step(size) returning one"
            )
        try:
            tx = self.step(int(size))
        except Exception as exc:  # noqa: BLE001 - any failure of the user's factory
            raise InvalidParameterError(
                f"step={getattr(self.step, '__name__', 'factory')} is invalid: as a factory "
                f"step(size) it raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc
        if not isinstance(tx, optax.GradientTransformation):
            raise InvalidParameterError(
                f"step={getattr(self.step, '__name__', 'factory')} is invalid: step({size}) returned "
                f"{type(tx).__name__}, must return an optax.GradientTransformation"
            )
        return tx

    @property
    def step_per_data_set(self) -> bool:
        """Whether D and D' run different steps (a factory given different sizes)."""
        factory = not isinstance(self.step, optax.GradientTransformation)
        return factory and self.examples != self.neighbour_examples

    def score_kind(self) -> str:
        """The gradient threat's score: ``'llr'``, ``'sum'`` or ``'custom'`` (a function of z)."""
        if callable(self.score):
            return "custom"
        if self.score == "auto":
            return "llr" if self.noise_multiplier is not None else "sum"
        if self.score == "llr" and self.noise_multiplier is None:
            raise InvalidParameterError(
                "score='llr' is invalid without noise_multiplier: give the run's S, or score='sum'"
            )
        return self.score

    def canary_norm(self) -> float:
        """The gradient canary's norm: ``canary.norm``, or 4 times the clipping norm (4 if unknown)."""
        if self.canary.norm is not None:
            return float(self.canary.norm)
        return DEFAULT_CANARY_NORM * (self.l2_norm_clip or 1.0)


def _share(bad: int, n: int) -> str:
    return f"{bad} of {n} ({100.0 * bad / n:.3g}%)"


def check_data(data: Any, *, default_loss: bool) -> tuple[np.ndarray, np.ndarray]:
    """The data as arrays, or one line naming what is wrong and the share of examples affected."""
    try:
        x, y = (np.asarray(a) for a in data)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(
            f"data is invalid: must be a pair (X [n, d], y [n]) ({exc})"
        ) from exc
    if x.ndim != 2 or y.ndim < 1 or y.shape[0] != x.shape[0] or x.shape[0] < 1:
        raise InvalidParameterError(
            f"data=<X {x.shape}, y {y.shape}> is invalid: must be X [n, d] and y [n] (or [n, k]), n >= 1"
        )
    for name, a in (("X", x), ("y", y)):
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise InvalidParameterError(f"data {name} is invalid: must hold numbers, got {a.dtype}")
        bad = int(np.sum(~np.isfinite(a.reshape(a.shape[0], -1).astype(np.float64)).all(axis=1)))
        if bad:
            what = "features" if name == "X" else "labels"
            raise InvalidParameterError(
                f"data {name} is invalid: {_share(bad, a.shape[0])} examples hold NaN or inf {what}"
            )
    if default_loss:
        check_integer_labels("data y", y)
    return x, y


def check_integer_labels(name: str, y: np.ndarray) -> None:
    """The default loss's labels: one class index per example (integers; whole floats accepted)."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise InvalidParameterError(
            f"{name} of shape {y.shape} is invalid: the default loss (softmax cross-entropy) needs "
            "one integer class per example; give loss_fn for other targets"
        )
    if not np.issubdtype(y.dtype, np.integer):
        frac = np.asarray(y, np.float64) % 1.0 != 0.0
        if frac.any():
            raise InvalidParameterError(
                f"{name} is invalid: {_share(int(frac.sum()), y.size)} labels are not integers "
                f"(e.g. {float(y[np.argmax(frac)]):g}): the default loss (softmax cross-entropy) "
                "needs class indices; give integer labels, or loss_fn for regression"
            )


def check_labels(y: np.ndarray, classes: int, *, name: str = "data y") -> None:
    """Raises unless every label is a class of a model with ``classes`` outputs, [0, classes)."""
    y = np.asarray(y, np.float64)
    bad = (y < 0) | (y >= classes)
    if bad.any():
        raise InvalidParameterError(
            f"{name} is invalid: {_share(int(bad.sum()), y.size)} labels lie outside the model's "
            f"{classes} classes [0, {classes - 1}] (e.g. {y[np.argmax(bad)]:g})"
        )


def check_input_canary(canary: Canary, x: np.ndarray, *, default_loss: bool) -> None:
    """The input canary's features have one example's shape and are finite; its label is a number."""
    cx = np.asarray(canary.x)
    if cx.shape != x.shape[1:]:
        raise InvalidParameterError(
            f"canary x of shape {cx.shape} is invalid: must be [{x.shape[1]}], the shape of one example"
        )
    if not np.all(np.isfinite(cx.astype(np.float64))):
        raise InvalidParameterError("canary x is invalid: it holds NaN or inf")
    if default_loss:
        check_integer_labels("canary y", np.atleast_1d(canary.y))


def load_problem(spec: str) -> TrainingProblem:
    """A :class:`TrainingProblem` built by a factory named ``'path/to/file.py:function'`` or ``'module:function'``.

    The factory is called with no arguments (a file outside any package imports fine).

    Raises:
      InvalidParameterError: Naming the file and function when either is missing, the file does not
        import, the factory raises, or it returns something other than a TrainingProblem.

    """
    from cbdp_jax._src.mechanism_auditor.loading import import_attribute

    factory = import_attribute("problem", spec)
    try:
        problem = factory()
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"problem={spec!r} is invalid: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - any failure of the user's factory
        raise InvalidParameterError(
            f"problem={spec!r} is invalid: it raised {describe(exc)}"
        ) from exc
    if not isinstance(problem, TrainingProblem):
        raise InvalidParameterError(
            f"problem={spec!r} is invalid: it returned {type(problem).__name__}, must return a "
            "cbdp_jax.training_audit.TrainingProblem"
        )
    check_model_on_data(problem, f"problem={spec!r}")
    return problem


def check_model_on_data(problem: TrainingProblem, what: str) -> None:
    """The model and loss run on one example of the data (traced, nothing computed or changed).

    A model that expects another input width, or a loss that does not fit the labels, otherwise
    fails deep inside the compiled training program; here it is one line naming the user's file and
    line (:func:`~cbdp_jax._src.infra.user_code.describe`).
    """
    import jax

    x, y = (np.asarray(a) for a in problem.data)
    loss = problem.loss_fn or cross_entropy
    graphdef, state = nnx.split(problem.model)
    try:
        jax.eval_shape(lambda s: loss(nnx.merge(graphdef, s), x[:1], y[:1]), state)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's model or loss
        raise InvalidParameterError(
            f"{what} is invalid: its model and loss_fn fail on one example of its data (x "
            f"{list(x.shape[1:])} per example): {describe(exc)}"
        ) from exc
