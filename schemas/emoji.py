"""A real dictionary without shipping data: the names of Unicode's emoji, from ``unicodedata``.

>>> names = emoji_dictionary()
>>> "GRINNING FACE" in names
True
"""

from __future__ import annotations

import unicodedata
from functools import cache

__all__ = ["emoji_dictionary"]

# the main emoji blocks: emoticons, pictographs, transport, supplemental, symbols & pictographs-A
_BLOCKS = (
    (0x1F300, 0x1F5FF),
    (0x1F600, 0x1F64F),
    (0x1F680, 0x1F6FF),
    (0x1F900, 0x1F9FF),
    (0x1FA70, 0x1FAFF),
    (0x2600, 0x26FF),
)


@cache
def emoji_dictionary() -> tuple[str, ...]:
    """Names of the emoji in the main Unicode emoji blocks (a few thousand, stable order)."""
    names = []
    for low, high in _BLOCKS:
        for code in range(low, high + 1):
            name = unicodedata.name(chr(code), "")
            if name:
                names.append(name)
    return tuple(names)
