"""Resumable sweeps: each completed unit of work is checkpointed atomically, with a fingerprint.

A long sweep (a capacity curve, a benchmark grid, ``cbdp reproduce all``) is a list of independent units
with stable string ids. :class:`UnitStore` writes each finished unit's result as its own JSON file via a
temporary name and a rename, so a kill at any instant leaves either the whole unit or nothing; a
restarted sweep skips the units already on disk. Results are read back in the sweep's own order, so the
final output of an interrupted-and-resumed run equals that of an uninterrupted one.

Every unit file carries a fingerprint of the unit's configuration (a JSON-able mapping: everything its
result depends on) and of the package version. A stored unit whose fingerprint differs from the one
the sweep asks for -- another configuration under the same id, or a file written by another version of
``cbdp_jax`` -- is *stale*: it is recomputed, and the report says so and why.

One process opens a folder at a time; worker processes it starts may write units into it
(``UnitStore(folder, clean=False)``), each unit through its own atomic rename.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cbdp_jax._src.infra.io import atomic_write_json, to_json
from cbdp_jax._src.infra.validation import InvalidParameterError, check_output_folder

# How a unit came to be in a sweep's results.
COMPUTED = "computed"  # not on disk before: computed now
REUSED = "reused"  # on disk with the same fingerprint: loaded, not computed
STALE = "stale"  # on disk with another fingerprint (configuration or version): recomputed now


def package_version() -> str:
    """The installed ``cbdp_jax`` version (part of every unit's fingerprint)."""
    from cbdp_jax._src.infra.version import __version__

    return str(__version__)


def fingerprint(unit_id: str, config: Mapping[str, Any] | None, version: str | None = None) -> str:
    """A stable hash of a unit's id, configuration and the package version.

    Args:
      unit_id: The unit's id.
      config: Everything the unit's result depends on (JSON-able), or None.
      version: The package version (default: the installed one).

    Returns:
      16 hex digits of the SHA-256 of the canonical JSON of the three.

    """
    payload = {
        "unit": unit_id,
        "config": None if config is None else json.loads(to_json(config)),
        "version": package_version() if version is None else version,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitReport:
    """What happened to one unit of a sweep.

    Attributes:
      unit_id: The unit's id.
      status: ``'computed'``, ``'reused'`` or ``'stale'`` (stored with another fingerprint, recomputed).
      seconds: Compute time: measured now, or (reused) the time stored with the unit; None if unknown.
      reason: Why a stale unit was recomputed (None otherwise).

    """

    unit_id: str
    status: str
    seconds: float | None
    reason: str | None = None


def _file_name(unit_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", unit_id)[:80]
    digest = hashlib.sha1(unit_id.encode()).hexdigest()[:10]
    return f"{safe}.{digest}.json"


class UnitStore:
    """A folder of completed units, one JSON file each.

    Args:
      folder: Where the unit files live (created if missing).
      clean: Remove temporary files left by a killed writer (True for the process that owns the
        folder; False in worker processes writing into a folder their parent opened).

    Examples:
      >>> import tempfile
      >>> store = UnitStore(tempfile.mkdtemp())
      >>> store.run(["a", "b"], lambda u: {"unit": u, "value": len(u)})
      [{'unit': 'a', 'value': 1}, {'unit': 'b', 'value': 1}]
      >>> store.done("a")
      True

    """

    def __init__(self, folder: str | Path, *, clean: bool = True):
        self.folder = check_output_folder("folder", folder)
        if clean:
            # A kill during a write can leave the temporary file of that write (never a unit file):
            # one process owns a folder, so any temporary file found on opening is an orphan.
            for orphan in self.folder.glob(".*.tmp"):
                orphan.unlink(missing_ok=True)

    def path(self, unit_id: str) -> Path:
        """The file holding ``unit_id``'s result."""
        return self.folder / _file_name(unit_id)

    def _read(self, unit_id: str) -> dict[str, Any] | None:
        try:
            with open(self.path(unit_id)) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return None

    def status(
        self, unit_id: str, config: Mapping[str, Any] | None = None
    ) -> tuple[str, str | None]:
        """Whether ``unit_id`` is stored and current.

        Returns:
          ``('missing', None)``, ``('done', None)`` or ``('stale', reason)``.

        """
        stored = self._read(unit_id)
        if stored is None:
            return "missing", None
        want = fingerprint(unit_id, config)
        have = stored.get("fingerprint")
        if have == want:
            return "done", None
        if have is None:
            return "stale", "stored without a fingerprint (by an older cbdp_jax)"
        version = stored.get("version")
        if version != package_version():
            return "stale", f"stored by cbdp_jax {version}, this is {package_version()}"
        return "stale", "stored with another configuration"

    def done(self, unit_id: str, config: Mapping[str, Any] | None = None) -> bool:
        """Whether ``unit_id`` has a complete, current result on disk."""
        return self.status(unit_id, config)[0] == "done"

    def load(self, unit_id: str) -> Any:
        """The stored result of ``unit_id``."""
        stored = self._read(unit_id)
        if stored is None:
            raise FileNotFoundError(self.path(unit_id))
        return stored["result"]

    def stored_seconds(self, unit_id: str) -> float | None:
        """The compute time stored with ``unit_id`` (None if absent or not recorded)."""
        stored = self._read(unit_id)
        return None if stored is None else stored.get("seconds")

    def save(
        self,
        unit_id: str,
        result: Any,
        *,
        config: Mapping[str, Any] | None = None,
        seconds: float | None = None,
    ) -> None:
        """Stores ``result`` (JSON-serialisable) for ``unit_id`` atomically, with its fingerprint."""
        record = {
            "unit": unit_id,
            "fingerprint": fingerprint(unit_id, config),
            "version": package_version(),
            "config": config,
            "seconds": seconds,
            "result": result,
        }
        atomic_write_json(self.path(unit_id), record)

    def ensure(
        self,
        unit_id: str,
        compute: Callable[[str], Any],
        *,
        config: Mapping[str, Any] | None = None,
    ) -> UnitReport:
        """Ensures ``unit_id`` is stored and current, computing it if needed; says what happened."""
        state, reason = self.status(unit_id, config)
        if state == "done":
            return UnitReport(unit_id=unit_id, status=REUSED, seconds=self.stored_seconds(unit_id))
        t0 = time.perf_counter()
        result = compute(unit_id)
        seconds = time.perf_counter() - t0
        self.save(unit_id, result, config=config, seconds=seconds)
        status = COMPUTED if state == "missing" else STALE
        return UnitReport(unit_id=unit_id, status=status, seconds=seconds, reason=reason)

    def run(
        self,
        unit_ids: Iterable[str],
        compute: Callable[[str], Any],
        *,
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        on_unit: Callable[[str, bool], None] | None = None,
        on_report: Callable[[UnitReport], None] | None = None,
    ) -> list[Any]:
        """Computes every unit not yet stored (or stale), in order, and returns all results in order.

        Args:
          unit_ids: Stable, unique ids of the sweep's units.
          compute: ``unit_id -> result``; called only for units not on disk or stale.
          configs: Optional ``unit_id -> configuration`` (fingerprinted; a stored unit with another
            fingerprint is recomputed).
          on_unit: Optional callback ``(unit_id, was_cached)`` after each unit (progress bars).
          on_report: Optional callback receiving a :class:`UnitReport` after each unit.

        Returns:
          The results, in the order of ``unit_ids``.

        """
        ids = list(unit_ids)
        if len(set(ids)) != len(ids):
            dupes = sorted({u for u in ids if ids.count(u) > 1})
            raise InvalidParameterError(
                f"unit_ids={dupes!r} is invalid: every unit id must be unique"
            )
        results = []
        for uid in ids:
            report = self.ensure(uid, compute, config=None if configs is None else configs[uid])
            results.append(self.load(uid))
            if on_unit is not None:
                on_unit(uid, report.status == REUSED)
            if on_report is not None:
                on_report(report)
        return results
