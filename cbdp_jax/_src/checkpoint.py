"""Resumable sweeps: each completed unit of work is checkpointed atomically.

One process writes a folder at a time. A long sweep (a capacity curve, a benchmark grid, ``cbdp reproduce all``) is a list of independent units
with stable string ids. :class:`UnitStore` writes each finished unit's result as its own JSON file via a
temporary name and a rename, so a kill at any instant leaves either the whole unit or nothing; a
restarted sweep skips the units already on disk. Results are read back in the sweep's own order, so the
final output of an interrupted-and-resumed run equals that of an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cbdp_jax._src.io import atomic_write_json
from cbdp_jax._src.validation import InvalidParameterError, check_output_folder


def _file_name(unit_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", unit_id)[:80]
    digest = hashlib.sha1(unit_id.encode()).hexdigest()[:10]
    return f"{safe}.{digest}.json"


class UnitStore:
    """A folder of completed units, one JSON file each.

    Args:
      folder: Where the unit files live (created if missing).

    Examples:
      >>> import tempfile
      >>> store = UnitStore(tempfile.mkdtemp())
      >>> store.run(["a", "b"], lambda u: {"unit": u, "value": len(u)})
      [{'unit': 'a', 'value': 1}, {'unit': 'b', 'value': 1}]
      >>> store.done("a")
      True

    """

    def __init__(self, folder: str | Path):
        self.folder = check_output_folder("folder", folder)
        # A kill during a write can leave the temporary file of that write (never a unit file):
        # one writer owns a folder, so any temporary file found on opening is an orphan.
        for orphan in self.folder.glob(".*.tmp"):
            orphan.unlink(missing_ok=True)

    def path(self, unit_id: str) -> Path:
        """The file holding ``unit_id``'s result."""
        return self.folder / _file_name(unit_id)

    def done(self, unit_id: str) -> bool:
        """Whether ``unit_id`` has a complete result on disk."""
        return self.path(unit_id).exists()

    def load(self, unit_id: str) -> Any:
        """The stored result of ``unit_id``."""
        with open(self.path(unit_id)) as fh:
            return json.load(fh)["result"]

    def save(self, unit_id: str, result: Any) -> None:
        """Stores ``result`` (JSON-serialisable) for ``unit_id`` atomically."""
        atomic_write_json(self.path(unit_id), {"unit": unit_id, "result": result})

    def run(
        self,
        unit_ids: Iterable[str],
        compute: Callable[[str], Any],
        *,
        on_unit: Callable[[str, bool], None] | None = None,
    ) -> list[Any]:
        """Computes every unit not yet stored, in order, and returns all results in order.

        Args:
          unit_ids: Stable, unique ids of the sweep's units.
          compute: ``unit_id -> result``; called only for units not on disk.
          on_unit: Optional callback ``(unit_id, was_cached)`` after each unit (progress bars).

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
            cached = self.done(uid)
            if not cached:
                self.save(uid, compute(uid))
            results.append(self.load(uid))
            if on_unit is not None:
                on_unit(uid, cached)
        return results
