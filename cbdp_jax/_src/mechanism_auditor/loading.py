"""Loading what an audit needs: a mechanism from a file or module, datasets, and sample files.

A mechanism is any function ``(key_or_rng, dataset, n) -> n outputs``. If it traces under ``jax.jit``
with a typed key it runs inside the compiled program; otherwise it is called on the host in batches
with a ``numpy.random.Generator`` seeded from the key (so numpy, JAX-on-host, torch or any library
whose arrays ``np.asarray`` accepts work). Every failure raises :class:`InvalidParameterError` naming
the file and function and what was wrong.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.infra.user_code import describe
from cbdp_jax._src.infra.validation import InvalidParameterError, check_int_at_least, check_key
from cbdp_jax._src.mechanism_auditor.blocks import spans

HOST_BATCH = 65536


class AuditRefusedError(InvalidParameterError):
    """An audit refused because some runs could not be checked (NaN or inf outputs or parameters).

    A subclass of :class:`InvalidParameterError`, so the command line prints its one line and exits
    with status 2: an audit that could not check every run never reports "no violation".
    """


def refuse_non_finite(name: str, outputs: np.ndarray, side: str, what: str = "outputs") -> None:
    """Raises :class:`AuditRefusedError` naming the share of rows of ``outputs`` ``[n, ...]`` not finite."""
    arr = np.asarray(outputs)
    if not np.issubdtype(arr.dtype, np.floating):  # a float copy of anything else
        arr = np.asarray(outputs, np.float64)
    arr = arr.reshape(len(outputs), -1)
    # a float is finite in float64 exactly when it is in its own dtype: no float64 copy, by blocks
    bad = sum(int(np.sum(~np.isfinite(arr[s]).all(axis=1))) for s in spans(len(arr)))
    if bad:
        n = arr.shape[0]
        raise AuditRefusedError(
            f"mechanism {name} is refused: {bad} of {n} {what} ({100.0 * bad / n:.3g}%) on {side} "
            "are NaN or inf; an audit certifies nothing about runs it could not check"
        )


def _as_outputs(where: str, out: Any, n: int) -> np.ndarray:
    """The outputs as float64 ``[n, d]``, or an error naming ``where`` and what was wrong."""
    try:
        arr = np.asarray(out)
    except Exception as exc:  # noqa: BLE001 - any array library's conversion failure
        raise InvalidParameterError(
            f"mechanism {where} is invalid: its output could not be read as an array ({exc})"
        ) from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise InvalidParameterError(
            f"mechanism {where} is invalid: must return numbers, got dtype {arr.dtype}"
        )
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] != n:
        raise InvalidParameterError(
            f"mechanism {where} is invalid: must return {n} outputs, shape ({n},) or ({n}, d); "
            f"got shape {np.shape(out)}"
        )
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        bad = int(np.sum(~np.isfinite(arr).all(axis=1)))
        raise InvalidParameterError(
            f"mechanism {where} is invalid: returned {bad} of {n} outputs with NaN or inf"
        )
    return arr


def host_rng(key: jax.Array) -> np.random.Generator:
    """A numpy Generator seeded from a typed JAX key (same key, same stream)."""
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())


@dataclasses.dataclass(frozen=True)
class AuditMechanism:
    """A user's mechanism, with how it runs.

    Attributes:
      fn: The function ``(key_or_rng, dataset, n) -> n outputs``.
      name: Where it came from (``'file.py:function'``), used in every message.
      batch: Host calls draw at most this many outputs at a time.

    """

    fn: Callable[..., Any]
    name: str
    batch: int = HOST_BATCH

    def runs_in_jax(self, dataset: Any) -> bool:
        """Whether the function traces under jit with a typed key on this dataset."""
        try:
            out = jax.eval_shape(lambda k: self.fn(k, jnp.asarray(dataset), 4), jax.random.key(0))
        except Exception:  # noqa: BLE001 - anything that does not trace runs on the host
            return False
        return isinstance(out, jax.ShapeDtypeStruct) and out.shape[:1] == (4,)

    def output_dim(self, dataset: Any) -> int:
        """Values per output on ``dataset`` (traced, never run); 1 for a host function (unknown)."""
        try:
            out = jax.eval_shape(lambda k: self.fn(k, jnp.asarray(dataset), 4), jax.random.key(0))
        except Exception:  # noqa: BLE001 - a function that does not trace runs on the host
            return 1
        shape = getattr(out, "shape", (4,))
        return int(np.prod(shape[1:])) if len(shape) > 1 else 1

    def sample(self, key: jax.Array, dataset: Any, n: int) -> np.ndarray:
        """N outputs on ``dataset`` as float64 ``[n, d]`` (jitted when the function traces)."""
        check_key(key)
        n = check_int_at_least("n", n, 1)
        if self.runs_in_jax(dataset):
            draw = _jitted(self.fn)
            try:
                out = draw(key, jnp.asarray(dataset), n)
            except Exception as exc:  # noqa: BLE001 - report any failure against the function
                raise InvalidParameterError(
                    f"mechanism {self.name} is invalid: raised {describe(exc)}"
                ) from exc
            return _as_outputs(self.name, out, n)
        rng = host_rng(key)
        parts, left = [], n
        while left > 0:
            m = min(left, self.batch)
            try:
                out = self.fn(rng, np.asarray(dataset), m)
            except Exception as exc:  # noqa: BLE001 - report any failure against the function
                raise InvalidParameterError(
                    f"mechanism {self.name} is invalid: raised {describe(exc)} "
                    f"(called with a numpy Generator, dataset {np.asarray(dataset).tolist()!r}, n={m})"
                ) from exc
            parts.append(_as_outputs(self.name, out, m))
            left -= m
        return np.concatenate(parts)


_JIT_CACHE: dict[int, Callable] = {}


def _jitted(fn: Callable) -> Callable:
    if id(fn) not in _JIT_CACHE:
        _JIT_CACHE[id(fn)] = jax.jit(fn, static_argnums=2)
    return _JIT_CACHE[id(fn)]


def import_attribute(name: str, spec: Any) -> Callable:
    """The callable ``'path/to/file.py:function'`` or ``'package.module:function'`` names.

    Raises:
      InvalidParameterError: Naming ``name``, the file or module and the function when either is
        missing, the file does not import, or the attribute is not callable.

    """
    if not isinstance(spec, str) or ":" not in spec:
        raise InvalidParameterError(
            f"{name}={spec!r} is invalid: must be FILE.py:FUNCTION or MODULE:FUNCTION"
        )
    where, _, func = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise InvalidParameterError(f"{name}={spec!r} is invalid: file {where} not found")
        module_name = f"_cbdp_audit_{abs(hash(str(path.resolve())))}"
        try:
            loader = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[module_name] = module
            loader.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - report any import failure against the file
            raise InvalidParameterError(
                f"{name}={spec!r} is invalid: {where} failed to import: {describe(exc)}"
            ) from exc
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # noqa: BLE001
            raise InvalidParameterError(
                f"{name}={spec!r} is invalid: module {where} failed to import: {exc}"
            ) from exc
    fn = getattr(module, func, None)
    if fn is None or not callable(fn):
        raise InvalidParameterError(
            f"{name}={spec!r} is invalid: {where} has no callable named {func!r}"
        )
    return fn


def load_mechanism(spec: str | Callable, name: str | None = None) -> AuditMechanism:
    """``'path/to/file.py:function'``, ``'package.module:function'`` or a callable.

    Raises:
      InvalidParameterError: Naming the file or module and the function when either is missing, the
        file does not import, or the attribute is not callable.

    """
    if callable(spec):
        return AuditMechanism(spec, name or getattr(spec, "__name__", "mechanism"))
    fn = import_attribute("mechanism", spec)
    return AuditMechanism(fn, spec)


def parse_dataset(name: str, text: str) -> np.ndarray:
    """A dataset from JSON text (a number or a nested list of numbers)."""
    try:
        value = json.loads(text)
        arr = np.asarray(value)
    except (json.JSONDecodeError, ValueError) as exc:
        raise InvalidParameterError(
            f"{name}={text!r} is invalid: must be JSON, a number or a list of numbers"
        ) from exc
    if not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)):
        raise InvalidParameterError(
            f"{name}={text!r} is invalid: must be JSON, a number or a list of finite numbers"
        )
    return arr


def load_samples(name: str, path: str | Path) -> np.ndarray:
    """Samples ``[n, d]`` float64 from ``.npy``, ``.npz`` (its only array, or ``samples``) or ``.csv``.

    A CSV may start with one header row (its first row is then skipped when no field of it is a
    number); every other row must be numbers.

    Raises:
      InvalidParameterError: Naming the option and the file: missing, unreadable, not numeric, not 1- or
        2-D, empty, or containing NaN / inf.

    """
    path = Path(path)
    if not path.is_file():
        raise InvalidParameterError(f"{name}={str(path)!r} is invalid: file not found")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                keys = list(z.keys())
                if len(keys) != 1 and "samples" not in keys:
                    raise InvalidParameterError(
                        f"{name}={str(path)!r} is invalid: an .npz must hold one array or one "
                        f"named 'samples'; it holds {keys}"
                    )
                arr = z["samples" if "samples" in keys else keys[0]]
        elif suffix == ".csv":
            arr = _csv_rows(path)
        else:
            raise InvalidParameterError(
                f"{name}={str(path)!r} is invalid: must be a .npy, .npz or .csv file"
            )
    except InvalidParameterError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable file of any kind
        raise InvalidParameterError(
            f"{name}={str(path)!r} is invalid: could not be read ({type(exc).__name__}: {exc})"
        ) from exc
    arr = np.asarray(arr)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise InvalidParameterError(f"{name}={str(path)!r} is invalid: must hold numbers")
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise InvalidParameterError(
            f"{name}={str(path)!r} is invalid: must hold a non-empty [n] or [n, d] array, "
            f"got shape {arr.shape}"
        )
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        bad = int(np.sum(~np.isfinite(arr).all(axis=1)))
        raise InvalidParameterError(
            f"{name}={str(path)!r} is invalid: {bad} rows contain NaN or inf"
        )
    return arr


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_rows(path: Path) -> np.ndarray:
    """The numeric rows of a CSV, after an optional header row of names."""
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    if rows and not any(_is_number(v.strip()) for v in rows[0]):
        rows = rows[1:]  # a header: names, no numbers
    for i, row in enumerate(rows):
        bad = next((v for v in row if not _is_number(v.strip())), None)
        if bad is not None:
            raise ValueError(
                f"row {i + 1} field {bad!r} is not a number (one header row is allowed)"
            )
    return np.array([[float(v) for v in r] for r in rows])


def finite_or(value: float, default: float = math.nan) -> float:
    """``value`` if finite, else ``default`` (for JSON)."""
    return value if math.isfinite(value) else default
