"""Atomic output files and run metadata.

Results users keep are written to a temporary file in the same folder and renamed into place, so an
interrupted run never leaves a half-written file behind. The temporary files being written are known
(:func:`remove_partial_writes`): a process stopped from another thread (:mod:`cbdp_jax._src.infra.interrupt`)
removes them before it exits.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import platform
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable")


def _sanitise(obj: Any) -> Any:
    """Replaces non-finite floats by the strings 'inf', '-inf', 'nan' (strict JSON has none)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Mapping):
        return {str(k): _sanitise(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitise(v) for v in obj]
    return obj


def to_json(obj: Any, *, indent: int | None = 2) -> str:
    """Serialises ``obj`` to strict JSON (non-finite floats become strings, numpy scalars floats)."""
    plain = json.loads(json.dumps(obj, default=_json_default, allow_nan=True))
    return json.dumps(_sanitise(plain), indent=indent, sort_keys=False, allow_nan=False)


# The temporary files of the writes in progress, and the lock that guards the set (and, held by a
# process that is stopping, keeps any new write from starting).
_PARTIAL: set[str] = set()
_PARTIAL_LOCK = threading.Lock()


def remove_partial_writes(timeout: float = 0.5) -> bool:
    """Deletes the temporary files of writes in progress and blocks new ones; for a process about to end.

    The lock is kept (never released), so no write starts afterwards; a write already past its rename
    is complete. Returns whether the lock was taken within ``timeout`` seconds (the files are deleted
    either way).
    """
    taken = _PARTIAL_LOCK.acquire(timeout=timeout)
    for tmp in list(_PARTIAL):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return taken


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> Path:
    """Writes ``data`` to ``path`` through a temporary file in the same folder and a rename.

    ``mode``: the file's permissions (default: 0666 less the umask, as for any file the user makes).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _PARTIAL_LOCK:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        _PARTIAL.add(tmp)
    try:
        if mode is None:
            # mkstemp creates 0600 files; results are ordinary files, so honour the umask instead.
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        _PARTIAL.discard(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Writes ``text`` (UTF-8) atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Writes ``obj`` as strict JSON atomically."""
    return atomic_write_text(path, to_json(obj) + "\n")


def atomic_write_csv(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Writes a list of dicts as CSV (header from the union of keys, in first-seen order)."""
    rows = list(rows)
    fields: list[str] = []
    for row in rows:
        for key in row:
            if key not in fields:
                fields.append(key)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k, "") for k in fields})
    return atomic_write_text(path, buf.getvalue())


def atomic_savefig(fig: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """Saves a matplotlib figure atomically (PNG by default)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=kwargs.pop("format", "png"), dpi=kwargs.pop("dpi", 130), **kwargs)
    return atomic_write_bytes(path, buf.getvalue())


def git_commit() -> str | None:
    """The commit of the source tree this package runs from.

    Outside a git checkout (a copied tree, an installed wheel) the environment variable ``CBDP_COMMIT``
    names it when set; otherwise None.
    """
    fallback = os.environ.get("CBDP_COMMIT") or None
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return fallback
    commit = out.stdout.strip() if out.returncode == 0 else ""
    return commit or fallback


def environment_info() -> dict[str, Any]:
    """Versions, device and commit: enough to say where a result came from."""
    import jax

    from cbdp_jax._src.infra.version import __version__

    devices = jax.devices()
    return {
        "cbdp_jax": __version__,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "platform": jax.default_backend(),
        "device": devices[0].device_kind if devices else "unknown",
        "device_count": len(devices),
        "x64": bool(jax.config.jax_enable_x64),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": git_commit(),
    }
