r"""Secret references in settings: the value ``${env:NAME}`` or ``${file:/path}``, resolved
where the setting is used, so a password sits neither in the configuration file nor in ``ps``.

``${env:NAME}`` is environment variable NAME; ``${file:/path}`` the file's text with one
trailing newline stripped (Docker and Kubernetes secret files, systemd ``LoadCredential``).
Only a whole value is a reference; ``$${...}`` is the literal ``${...}``. Kafka settings
(``[kafka.extra]`` and ``-X``) are resolved in ``ldpipe.infra.runtime.kafka.KafkaSettings``, the
store's ``storage_options`` in ``ldpipe.infra.storage.sketch_store.SketchStore``. Errors name the
setting and the reference, never a value (``docs/configuration.md#secrets``).

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as run:
...     secret = Path(run, "kafka-password")
...     _ = secret.write_text("hunter2\n")  # as `echo hunter2 > ...` writes it
...     resolve(f"${{file:{secret}}}", "kafka.extra.sasl.password")
'hunter2'
>>> resolve("$${env:KAFKA_PASSWORD}", "kafka.extra.sasl.password")  # escaped: a literal
'${env:KAFKA_PASSWORD}'
>>> resolve_all({"sasl.username": "ldpipe", "linger.ms": 5}, "kafka.extra")
{'sasl.username': 'ldpipe', 'linger.ms': 5}
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ldpipe.schemas.config_checks import ConfigError

__all__ = ["is_reference", "resolve", "resolve_all"]

_REFERENCE: Final = re.compile(r"\$\{([^:}]*):(.*)\}", re.DOTALL)
_ESCAPED: Final = re.compile(r"\$(\$+\{.*\})", re.DOTALL)  # $${...} -> ${...}, $$${...} -> $${...}
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYNTAX: Final = "write ${env:NAME} or ${file:/absolute/path}, or $${...} for a literal ${...}"


def is_reference(value: object) -> bool:
    """Whether ``value`` is a whole-value reference (``${...}``, not escaped)."""
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def resolve(value: str, setting: str) -> str:
    """``value`` with a reference replaced by the secret; any other value unchanged.

    Raises :class:`~ldpipe.schemas.config_checks.ConfigError` naming ``setting``, the reference
    and the fix when the variable is not set, the file cannot be read, or the reference is
    malformed.
    """
    escaped = _ESCAPED.fullmatch(value)
    if escaped is not None:
        return escaped.group(1)
    if not is_reference(value):
        return value
    match = _REFERENCE.fullmatch(value)
    kind, target = (match.group(1), match.group(2)) if match else ("", "")
    if kind == "env" and _ENV_NAME.fullmatch(target):
        return _from_env(target, value, setting)
    if kind == "file" and target:
        return _from_file(target, value, setting)
    shown = f"${{{kind}:...}}" if kind else "${...}"  # what follows the kind may be a secret
    raise ConfigError(f"{setting}: {shown} is not a secret reference; {_SYNTAX}")


def resolve_all(mapping: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Every value of ``mapping`` resolved (``prefix.key`` names it in errors); values that
    are not strings (numbers, booleans) pass through unchanged."""
    return {
        key: resolve(value, f"{prefix}.{key}") if isinstance(value, str) else value
        for key, value in mapping.items()
    }


def _from_env(name: str, reference: str, setting: str) -> str:
    secret = os.environ.get(name)
    if secret is None:
        raise ConfigError(
            f"{setting}: {reference}: environment variable {name} is not set; export it to "
            f"ldpipe's environment, or use ${{file:/run/secrets/...}}"
        )
    return secret


def _from_file(path: str, reference: str, setting: str) -> str:
    if not Path(path).is_absolute():
        raise ConfigError(
            f"{setting}: {reference}: the path is relative; give an absolute one, "
            f"e.g. ${{file:/run/secrets/{Path(path).name}}}"
        )
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"{setting}: {reference}: cannot read {path} ({why}); create it and make it "
            f"readable by ldpipe's user, or use ${{env:NAME}}"
        ) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # its message would quote the secret's bytes: not chained
        raise ConfigError(
            f"{setting}: {reference}: {path} is not UTF-8 text; write the secret as text"
        ) from None
    return text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
