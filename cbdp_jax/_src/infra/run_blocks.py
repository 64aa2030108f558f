"""Checkpoints of many runs: their outputs in blocks as they finish, so a killed audit resumes.

A long training audit (10^7 runs per side: half an hour and more) keeps nothing if it is killed.
:class:`RunBlocks` is a folder that :func:`~cbdp_jax._src.infra.sharded_runs.sharded_runs` writes the
runs' outputs into, in blocks of consecutive runs (every ``every_seconds`` and at the end), and
reads back on ``resume``: the runs done are loaded, the rest computed. Run i's key is key i of
``jax.random.split(key, n)`` whatever the block, and a checkpointed call keeps one fixed chunk (the
stored one on resume), so a killed and resumed call returns the same outputs, bit for bit, as one
left alone.

Each call of ``sharded_runs`` (one side of an audit) is a *part*, named by its key, its arguments
and n. A block is one ``.npz`` file holding every leaf of the output pytree for runs
``start .. stop - 1`` (any shapes and dtypes: what the run returns), written through a temporary
file and a rename (:func:`~cbdp_jax._src.infra.io.atomic_write_bytes`), so a kill leaves the whole block or
none. The folder's ``manifest.json`` holds the fingerprint of the audit's identity (the problem,
the claim, the audit's settings, the key) and of the package version
(:func:`~cbdp_jax._src.infra.checkpoint.fingerprint`, the sweep's): a folder written for another identity
or version is refused on resume with one line.

References:
  The sweep's checkpoints (:mod:`~cbdp_jax._src.infra.checkpoint`): the same fingerprint and atomic writes.

"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cbdp_jax._src.infra.checkpoint import fingerprint, package_version
from cbdp_jax._src.infra.io import atomic_write_bytes, atomic_write_json
from cbdp_jax._src.infra.validation import InvalidParameterError, check_output_folder

MANIFEST = "manifest.json"
SECONDS_VARIABLE = "CBDP_JAX_CHECKPOINT_SECONDS"
_BLOCK = re.compile(
    r"^(?P<part>[0-9a-f]{16})\.(?P<start>\d{12})\.(?P<stop>\d{12})\.c(?P<chunk>\d+)\.npz$"
)


class RunBlocks:
    """A checkpoint folder for the runs of one audit (module docstring).

    Args:
      folder: The folder (created if missing).
      identity: Everything the runs' outputs depend on, JSON-able (fingerprinted with the version).
      resume: Keep the blocks of a folder written for the same identity and version (refusing one
        written for another); False starts afresh, deleting the folder's blocks.
      every_seconds: The least time between two blocks written by one call (default
        ``$CBDP_JAX_CHECKPOINT_SECONDS``, else 10).

    Examples:
      >>> import tempfile
      >>> blocks = RunBlocks(tempfile.mkdtemp(), {"audit": "demo"})
      >>> part = blocks.part("side 1")
      >>> part.save(0, 3, [np.arange(3.0)], chunk=8)
      >>> done, blocks_leaves, chunk = part.load()
      >>> done, [leaf.tolist() for leaf in blocks_leaves[0]], chunk
      (3, [[0.0, 1.0, 2.0]], 8)

    """

    def __init__(self, folder: str | Path, identity: Mapping[str, Any], *, resume: bool = False,
                 every_seconds: float | None = None):  # fmt: skip
        self.folder = check_output_folder("checkpoint", folder)
        if every_seconds is None:
            every_seconds = float(os.environ.get(SECONDS_VARIABLE, "10"))
        self.every_seconds = float(every_seconds)
        self.fingerprint = fingerprint("training-runs", identity)
        manifest = self.folder / MANIFEST
        stored = _read_json(manifest)
        if resume and stored is not None and stored.get("fingerprint") != self.fingerprint:
            raise InvalidParameterError(_refusal(folder, stored))
        if not resume or stored is None:
            for old in self.folder.glob("*.npz"):  # the blocks only: no other file is touched
                if _BLOCK.match(old.name):
                    old.unlink(missing_ok=True)
            record = {"fingerprint": self.fingerprint, "version": package_version(),
                      "identity": identity}  # fmt: skip
            atomic_write_json(manifest, record)
        for orphan in self.folder.glob(".*.tmp"):  # a killed write's temporary file
            orphan.unlink(missing_ok=True)

    def part(self, name: str) -> BlockPart:
        """The blocks of one call (``name``: what tells it from the audit's other calls)."""
        return BlockPart(self, hashlib.sha256(name.encode()).hexdigest()[:16])


class BlockPart:
    """The blocks of one call of ``sharded_runs``: :meth:`load` what is done, :meth:`save` a block."""

    def __init__(self, owner: RunBlocks, tag: str):
        self.owner, self.tag = owner, tag
        self.every_seconds = owner.every_seconds

    def _blocks(self) -> list[tuple[int, int, int, Path]]:
        found = []
        for path in self.owner.folder.glob(f"{self.tag}.*.npz"):
            m = _BLOCK.match(path.name)
            if m:
                found.append((int(m["start"]), int(m["stop"]), int(m["chunk"]), path))
        return sorted(found)

    def load(self) -> tuple[int, list[list[np.ndarray]], int | None]:
        """Runs done (the blocks from run 0 on, without a gap), their leaves per block, the chunk."""
        done, leaves, chunk = 0, [], None
        for start, stop, c, path in self._blocks():
            if start != done:
                break
            with np.load(path, allow_pickle=False) as data:
                leaves.append([data[f"leaf{i}"] for i in range(len(data.files))])
            done, chunk = stop, c
        return done, leaves, chunk

    def save(self, start: int, stop: int, leaves: list[np.ndarray], *, chunk: int) -> None:
        """Writes the outputs of runs ``start .. stop - 1`` (the output pytree's leaves) atomically."""
        buffer = io.BytesIO()
        np.savez(buffer, **{f"leaf{i}": np.asarray(a) for i, a in enumerate(leaves)})
        name = f"{self.tag}.{start:012d}.{stop:012d}.c{chunk}.npz"
        atomic_write_bytes(self.owner.folder / name, buffer.getvalue())


def _read_json(path: Path) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _refusal(folder, stored: dict) -> str:
    version = stored.get("version")
    if version != package_version():
        why = f"it was written by cbdp_jax {version}, this is {package_version()}"
    else:
        why = "it holds the runs of another audit (problem, claim, settings or seed)"
    return (
        f"checkpoint={str(folder)!r} is invalid with resume: {why}; give another folder, or "
        "start afresh without resume"
    )
