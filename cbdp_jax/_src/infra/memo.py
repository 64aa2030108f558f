"""Values kept by the identity of the objects they were built from, the newest few.

The training audit keeps its compiled run programs and its mechanisms this way: a problem holds a
Flax module, so it is not hashable, and two problems that compare equal may still hold different
models.
"""

from __future__ import annotations

from typing import Any


def remembered(store: dict, owners: tuple, extra: Any, build, *, keep: int) -> Any:
    """``build()``, kept in ``store`` under the identity of ``owners`` and ``extra``.

    Identity, not equality: a problem holds a module, so it is not hashable. A hit must hold the very
    same objects; the ``keep`` newest entries stay.
    """
    key = (*map(id, owners), extra)
    hit = store.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], owners, strict=True)):
        return hit[1]
    value = build()
    while len(store) >= keep:
        store.pop(next(iter(store)))
    store[key] = (owners, value)
    return value
