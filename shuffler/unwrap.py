"""What the shuffler learns of a batch of consumed reports before its window sees them.

Per report: the Kafka fields (value, ``(topic, partition, offset)``, key), the size rule, and
for a use case with nested envelopes the outer open (``schemas/outer.py``) and the inner check
(``shuffler/inner.py``). None of it depends on what the window, the replay ledger or the
contribution ledger hold, so the shuffler runs it over the whole consumed batch first, in one
loop, and only then takes the reports in order (``Shuffler._take``); a report refused here
carries its reason and layer to the dead-letter topic as before (``docs/shuffler.md``).
Running the stage over the batch keeps each loop's code and data warm, and builds one tuple per
report instead of a header object and a call chain per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from confluent_kafka import Message

from ldpipe.infra.runtime.kafka import message_position
from ldpipe.schemas.envelope import EnvelopeError
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import open_outer
from ldpipe.shuffler.inner import InnerClass, Rejection

__all__ = ["Unwrapped", "unwrap"]

#: a consumed report: what was received (all a refused report's dead letter carries: never the
#: inner envelope, which beside ``ldpipe.source`` would link it to its client), what the window
#: would hold (the inner envelope when nested), ``(topic, partition, offset)``, the Kafka key,
#: the outer layer's report id and time, the inner class ``(epoch, key id)``, and the reason
#: and layer of a refusal ("" if none)
Unwrapped = tuple[
    bytes,
    bytes,
    tuple[str, int, int],
    bytes | None,
    bytes | None,
    int | None,
    InnerClass | None,
    str,
    str,
]


def unwrap(
    messages: Sequence[Message],
    *,
    use_case: str,
    keyring: KeyRing | None,
    classify: Callable[[bytes], InnerClass | Rejection],
    size_limit: int,
    fresh_size_limit: Callable[[], int],
) -> list[Unwrapped]:
    """Each message as :data:`Unwrapped`, in order. ``keyring`` is the shuffler's for nested
    envelopes, ``None`` for single-layer ones (forwarded as they are); a report longer than
    ``size_limit`` and than ``fresh_size_limit()`` (after reloading published epochs) is
    refused as ``too_large`` before anything else."""
    nested = keyring is not None
    unwrapped: list[Unwrapped] = []
    append = unwrapped.append
    for msg in messages:
        value = msg.value() or b""
        source, key = message_position(msg), msg.key()
        if len(value) > size_limit:
            size_limit = max(size_limit, fresh_size_limit())
            if len(value) > size_limit:
                layer = "outer" if nested else ""
                append((value, value, source, key, None, None, None, "too_large", layer))
                continue
        if keyring is None:
            append((value, value, source, key, None, None, None, "", ""))
            continue
        try:
            header, inner = open_outer(value, keyring, use_case=use_case)
        except EnvelopeError as exc:
            append((value, value, source, key, None, None, None, str(exc.reason), "outer"))
            continue
        checked = classify(inner)
        if isinstance(checked[0], str):  # refused: the inner envelope would stand out
            append((value, inner, source, key, None, None, None, str(checked[0]), "inner"))
            continue
        append((value, inner, source, key, header.report_id, header.time, checked, "", ""))
    return unwrapped
