"""Item normalization and bounding for discovery (GCMS paper §7.5; Apple §4.3, §6.1).

Devices, the aux server and the server must agree on what "the same item" is: the tag
``H(d)`` (``schemas/discovery/tags.py``) groups equal items, so two spellings of one word that
should be counted together must become the same bytes *before* hashing. :func:`normalize_item` is
that function, configured by :class:`ItemRules`; ``schemas/discovery.md`` ("Items") specifies it and
``schemas/vectors/discovery.json`` has vectors. The steps, in order:

1. ``bytes`` must be UTF-8 (``invalid_utf8``); anything but ``str``/``bytes`` is ``not_text``;
   a ``str`` that cannot be encoded as UTF-8 (a lone surrogate) is ``invalid_utf8``.
2. Unicode NFC; then, if ``strip``, leading and trailing whitespace (``str.strip``) is removed;
   then, if ``lowercase``, ``str.lower`` and NFC again.
3. ``mode="url"``: the item must be an absolute URL with a host free of whitespace and control
   characters (``not_a_url`` otherwise); it becomes ``scheme://host[:port]path``: scheme and
   host lower-cased, the port kept only when it is not the scheme's default (http 80, https
   443), an empty path becoming ``/``, and the user info, query and fragment dropped (they are
   where session ids and personal data live; the GCMS paper's §7.5 cut URLs to 20 characters for
   the same reason); then NFC and, if ``strip``, stripping again.
4. Bounding to ``max_bytes`` UTF-8 bytes, never splitting a character:

   * ``text``: the longest prefix that fits and does not end inside a character, nor before a
     combining mark (category M), nor on either side of a ZERO WIDTH JOINER, nor before an emoji
     modifier, nor inside a regional-indicator pair (a flag) — a standard-library approximation
     of extended grapheme clusters (UAX #29). If that leaves nothing (one base character with
     more marks than fit), the prefix of whole code points is taken instead, without a
     trailing joiner. Apple truncates
     words the same way (a fixed number of characters, §6.1).
   * ``url``: ``scheme://host[:port]`` is kept whole and the path is cut after its last ``/``
     that fits (``https://a.example/x/y/z`` at 20 bytes gives ``https://a.example/``; when not
     even the first ``/`` fits, the origin alone). An origin longer than ``max_bytes`` is
     refused (``url_too_long``): a cut host names nothing, and would not be a URL.

   The cut is followed by NFC and, if ``strip``, by stripping again.
5. An empty result is ``empty_item``.

The function is idempotent: a normalized item normalizes to itself (tested with hypothesis).

>>> normalize_item("  Cafe\\u0301 ", ItemRules(lowercase=True))
'café'
>>> normalize_item("https://User:pw@Example.COM:443/a/b?session=42#x", ItemRules(mode="url"))
'https://example.com/a/b'
>>> normalize_item("https://example.com/path/to/resource", ItemRules(mode="url", max_bytes=25))
'https://example.com/path/'
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

from ldpipe.schemas.discovery.exceptions import DiscoveryError, DiscoveryRejection

__all__ = [
    "MAX_ITEM_BYTES",
    "ItemMode",
    "ItemRules",
    "normalize_item",
    "normalize_items",
]

ItemMode = Literal["text", "url"]
MAX_ITEM_BYTES: Final = 1024  # every report is padded to max_bytes, so keep it small
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_ZWJ: Final = "\u200d"


@dataclass(frozen=True)
class ItemRules:
    """How items are normalized and bounded; part of a discovery use case's parameters.

    ``max_bytes`` (1-1024) is also the padded size of every report's item field
    (``schemas/discovery.md``), so every report of a use case has the same length.

    >>> ItemRules(max_bytes=32, mode="url")
    ItemRules(max_bytes=32, mode='url', lowercase=False, strip=True)
    """

    max_bytes: int = 64
    mode: ItemMode = "text"
    lowercase: bool = False
    strip: bool = True

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_bytes, bool)
            or not isinstance(self.max_bytes, int)
            or not 1 <= self.max_bytes <= MAX_ITEM_BYTES
        ):
            raise ValueError(
                f"max_bytes must be an integer in [1, {MAX_ITEM_BYTES}], got {self.max_bytes!r}; "
                f"every report is padded to it, so choose the longest item worth discovering "
                f"(words: 32-64, URLs: 64-128)"
            )
        if self.mode not in ("text", "url"):
            raise ValueError(f"mode must be 'text' or 'url', got {self.mode!r}")
        for name in ("lowercase", "strip"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


def normalize_item(item: object, rules: ItemRules = ItemRules()) -> str:
    """The normalized, bounded form of ``item`` (module docstring, steps 1-5).

    Raises ``DiscoveryError`` (and nothing else, whatever ``item`` is) with reason
    ``not_text``, ``invalid_utf8``, ``not_a_url``, ``url_too_long`` or ``empty_item``.
    """
    text = _as_text(item)
    text = unicodedata.normalize("NFC", text)
    if rules.strip:
        text = text.strip()
    if rules.lowercase:
        text = unicodedata.normalize("NFC", text.lower())
    if rules.mode == "url":
        text = _url(text)
        if rules.strip:  # the path may end in whitespace
            text = text.strip()
    text = _bound(text, rules)
    if not text:
        raise DiscoveryError(
            DiscoveryRejection.EMPTY_ITEM,
            "the item is empty after normalization (NFC, strip); a device does not report "
            "an empty item",
        )
    return text


def normalize_items(
    items: Iterable[object], rules: ItemRules = ItemRules()
) -> list[str | DiscoveryError]:
    """:func:`normalize_item` over a batch, in order; a refused item gives its error."""
    out: list[str | DiscoveryError] = []
    for item in items:
        try:
            out.append(normalize_item(item, rules))
        except DiscoveryError as exc:
            out.append(exc)
    return out


# ---- steps ---------------------------------------------------------------------------------
def _as_text(item: object) -> str:
    if isinstance(item, bytes | bytearray | memoryview):
        try:
            return bytes(item).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DiscoveryError(
                DiscoveryRejection.INVALID_UTF8,
                f"item bytes are not UTF-8 ({exc.reason} at byte {exc.start}); pass text",
            ) from None
    if not isinstance(item, str):
        raise DiscoveryError(
            DiscoveryRejection.NOT_TEXT, f"an item must be str or bytes, got {type(item).__name__}"
        )
    try:
        item.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DiscoveryError(
            DiscoveryRejection.INVALID_UTF8,
            f"item has a character UTF-8 cannot encode ({exc.reason} at {exc.start}), "
            f"e.g. a lone surrogate",
        ) from None
    return item


def _not_a_url(text: str, why: str) -> DiscoveryError:
    return DiscoveryError(
        DiscoveryRejection.NOT_A_URL,
        f"item is not an absolute URL with a host ({why}): {len(text)} characters; "
        f"the use case is in url mode, so report items like 'https://example.com/path'",
    )


def _url(text: str) -> str:
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise _not_a_url(text, str(exc)) from None
    host = parts.hostname
    if not parts.scheme or not host:
        raise _not_a_url(text, "no scheme or no host")
    if any(char.isspace() or unicodedata.category(char).startswith("C") for char in host):
        raise _not_a_url(text, "whitespace or a control character in the host")
    scheme = parts.scheme.lower()
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    port_text = "" if port is None or _DEFAULT_PORTS.get(scheme) == port else f":{port}"
    # urllib lower-cases the host with str.lower, which may leave NFC: normalize again
    return unicodedata.normalize("NFC", f"{scheme}://{host}{port_text}{parts.path or '/'}")


def _bound(text: str, rules: ItemRules) -> str:
    limit = rules.max_bytes
    while len(text.encode("utf-8")) > limit:  # each pass shortens: cut < len(text)
        cut = _url_cut(text, limit) if rules.mode == "url" else _text_cut(text, limit)
        text = text[:cut]
        text = unicodedata.normalize("NFC", text)  # a prefix may compose differently
        if rules.strip:
            text = text.strip()
    return text


def _fitting_chars(text: str, limit: int) -> int:
    """How many leading code points fit in ``limit`` UTF-8 bytes."""
    total = 0
    for index, char in enumerate(text):
        total += len(char.encode("utf-8"))
        if total > limit:
            return index
    return len(text)


def _is_regional_indicator(char: str) -> bool:
    return "\U0001f1e6" <= char <= "\U0001f1ff"


def _splits_cluster(text: str, cut: int) -> bool:
    """Whether cutting ``text`` before index ``cut`` would split a (grapheme-like) cluster."""
    after, before = text[cut], text[cut - 1]
    if unicodedata.category(after).startswith("M") or _ZWJ in (after, before):
        return True
    if "\U0001f3fb" <= after <= "\U0001f3ff":  # emoji modifiers (skin tones)
        return True
    if _is_regional_indicator(after) and _is_regional_indicator(before):
        run = 0
        while run < cut and _is_regional_indicator(text[cut - 1 - run]):
            run += 1
        return run % 2 == 1  # an odd run before the cut: the pair would be split
    return False


def _text_cut(text: str, limit: int) -> int:
    fit = _fitting_chars(text, limit)
    cut = fit
    while 0 < cut < len(text) and _splits_cluster(text, cut):
        cut -= 1
    if cut == 0:  # one cluster longer than the limit: whole code points, no dangling joiner
        cut = fit
        while cut > 1 and text[cut - 1] == _ZWJ:
            cut -= 1
    return cut


def _url_cut(text: str, limit: int) -> int:
    """Where to cut a normalized URL: after the last path '/' that fits, else after the origin
    (``scheme://host[:port]``); ``url_too_long`` if the origin does not fit."""
    start = text.find("://")
    slash = text.find("/", start + 3) if start >= 0 else -1
    origin = text if slash < 0 else text[:slash]
    if slash < 0 or len(origin.encode("utf-8")) > limit:
        raise DiscoveryError(
            DiscoveryRejection.URL_TOO_LONG,
            f"the URL's scheme://host[:port] is {len(origin.encode('utf-8'))} bytes, more than "
            f"the use case's max_bytes ({limit}); raise max_bytes",
        )
    fit = _fitting_chars(text, limit)
    last = text.rfind("/", slash, fit)
    return last + 1 if last >= 0 else slash
