"""The compiled-program folders load nothing another user could have written.

Both caches in the cache folder run what they load: the program store (:mod:`cbdp_jax._src.infra.programs`)
unpickles ``*.jaxexe`` files, and JAX's persistent compilation cache (:mod:`cbdp_jax._src.infra.cache`)
holds native executables. A file someone else planted there runs as the user who loads it, so -- as
ssh treats its key files -- the folders are trusted only when no one else can write into them:

- folders this package creates are private to the user (mode 0700), every missing one from the
  cache root down, and store files are written 0600;
- before the store loads a file, and before JAX's cache is switched on, the cache root and every
  folder from it down to the file must be owned by the user and not writable by group or others, and
  the file owned by the user;
- every folder above the root that group or others may write into must have the sticky bit (as
  ``/tmp`` has), so that no one else can rename the root away and put their own in its place.

Otherwise neither cache is used, and one warning on standard error names the folder and why. Where
the platform has no user ids (Windows), nothing is checked.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

_WARNED: set[str] = set()


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)
    return None if getuid is None else getuid()


def _mode(st: os.stat_result) -> str:
    return oct(stat.S_IMODE(st.st_mode))


def _ancestor_problem(folder: Path, st: os.stat_result) -> str | None:
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (
            f"{folder} (above the cache folder) is writable by group or others without the sticky "
            f"bit (mode {_mode(st)}): someone else could replace the cache folder"
        )
    return None


def _owned_problem(path: Path, st: os.stat_result, uid: int, what: str) -> str | None:
    if st.st_uid != uid:
        return f"{what} {path} is owned by user id {st.st_uid}, not by you ({uid})"
    if what == "folder" and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"folder {path} is writable by group or others (mode {_mode(st)})"
    return None


def problem(root: str | os.PathLike, path: str | os.PathLike | None = None) -> str | None:
    """Why files under ``root`` (down to ``path``, a file or folder) cannot be trusted; None if they can.

    Args:
      root: The cache root.
      path: A file or folder at or under ``root`` (default: the root itself). A file is checked for
        its owner, each folder from ``root`` down to it for owner and write permissions.

    Returns:
      None when safe (or on a platform without user ids), else one sentence naming the folder or file.

    """
    uid = _uid()
    if uid is None:
        return None
    root = Path(os.path.abspath(root))
    target = root if path is None else Path(os.path.abspath(path))
    try:
        for folder in reversed(root.parents):
            reason = _ancestor_problem(folder, os.stat(folder))
            if reason:
                return reason
        chain = [root]
        if target != root:
            relative = target.relative_to(root)  # ValueError: not under the root
            for part in relative.parts:
                chain.append(chain[-1] / part)
        for item in chain:
            st = os.stat(item)
            what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
            reason = _owned_problem(item, st, uid, what)
            if reason:
                return reason
    except FileNotFoundError:
        return None  # nothing there to load (a miss); folders are created private before writing
    except (OSError, ValueError) as exc:
        return f"{target} could not be checked ({exc})"
    return None


def warn(reason: str, root: str | os.PathLike) -> None:
    """One warning per process and cache root: neither cache is used, and why."""
    key = str(Path(os.path.abspath(root)))
    if key in _WARNED:
        return
    _WARNED.add(key)
    text = (
        f"warning: compiled programs in {key} are not used (neither loaded nor stored; JAX's "
        f"compilation cache off): {reason}. Programs there could run code as you. Use a folder "
        "only you can write to (chmod 700 on it and no group or world write permission above it "
        "without the sticky bit), or set CBDP_JAX_CACHE_DIR to one."
    )
    try:  # 80 columns, continuation lines indented; paths are never broken at hyphens
        lines = textwrap.wrap(
            text, 79, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
        )
        sys.stderr.write("\n".join(lines) + "\n")
    except (OSError, ValueError):
        pass


def trusted(root: str | os.PathLike, path: str | os.PathLike | None = None) -> bool:
    """Whether ``path`` under ``root`` may be loaded (see :func:`problem`); warns once if not."""
    reason = problem(root, path)
    if reason is None:
        return True
    warn(reason, root)
    return False


def make_private(root: str | os.PathLike, folder: str | os.PathLike | None = None) -> bool:
    """Creates every missing folder from above ``root`` down to ``folder`` with mode 0700.

    Returns whether the folders can then be trusted (:func:`trusted`; a warning otherwise). An
    ``OSError`` from creating them (a read-only home) is raised.
    """
    root = Path(os.path.abspath(root))
    folder = root if folder is None else Path(os.path.abspath(folder))
    missing = []
    for item in [folder, *folder.parents]:
        if item.exists():
            break
        missing.append(item)
    # what exists already is checked before anything is created in it
    existing = item if item == root or root in item.parents else root
    if not trusted(root, existing):
        return False
    for item in reversed(missing):
        try:
            os.mkdir(item, 0o700)
        except FileExistsError:  # another process made it meanwhile: checked below like any folder
            pass
    return trusted(root, folder)


def write_private(root: str | os.PathLike, path: str | os.PathLike, data: bytes) -> bool:
    """Writes ``data`` to ``path`` under ``root`` atomically, mode 0600, in private folders.

    Nothing is written into a folder that cannot be trusted; returns whether the file was written.
    """
    from cbdp_jax._src.infra.io import atomic_write_bytes

    path = Path(path)
    if not make_private(root, path.parent):
        return False
    atomic_write_bytes(path, data, mode=0o600)
    return True


__all__ = ["make_private", "problem", "trusted", "warn", "write_private"]
