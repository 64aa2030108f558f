"""The pure training core, usable inside your own jit / vmap / scan (public API).

``trainer(adversary, divergence, dim=..., optimizer=...)`` returns a :class:`Trainer` of pure
functions over NamedTuple pytrees, blackjax style: ``init(key, x_reference) -> TrainState``,
``step(key, state, (x_p, x_q), alpha=None) -> (TrainState, StepInfo)``, ``value`` and ``apply``.
The estimator and the sweep are drivers around these functions. ``fit`` turns a trained adversary into
the fixed critic that held-out evaluation certifies (docs/theory/objectives.md).
"""

from cbdp_jax._src.estimator.adversaries import ClassProperties as ClassProperties
from cbdp_jax._src.estimator.adversaries import CustomAdversary as CustomAdversary
from cbdp_jax._src.estimator.adversary_fitting import train_ensemble as train_ensemble
from cbdp_jax._src.estimator.adversary_fitting_ensemble import (
    early_stopping_scan as early_stopping_scan,
)
from cbdp_jax._src.estimator.adversary_fitting_ensemble import init_ensemble as init_ensemble
from cbdp_jax._src.estimator.core import StepInfo as StepInfo
from cbdp_jax._src.estimator.core import Trainer as Trainer
from cbdp_jax._src.estimator.core import TrainState as TrainState
from cbdp_jax._src.estimator.core import default_optimizer as default_optimizer
from cbdp_jax._src.estimator.core import fit as fit
from cbdp_jax._src.estimator.core import set_learning_rate as set_learning_rate
from cbdp_jax._src.estimator.core import trainer as trainer

__all__ = [
    "ClassProperties",
    "CustomAdversary",
    "StepInfo",
    "TrainState",
    "Trainer",
    "default_optimizer",
    "early_stopping_scan",
    "fit",
    "init_ensemble",
    "set_learning_rate",
    "train_ensemble",
    "trainer",
]
