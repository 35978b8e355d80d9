"""How ldpipe runs: two floors, one above the services and one below them.

* ``ldpipe.infra.cli`` — the top floor: the ``ldpipe`` command (``main.py``), one module per
  command, and the local pipeline the demo and integration tests run. It may import anything.
* ``ldpipe.infra.runtime`` — the floor under every service: Kafka settings and topics, the
  embedded broker, dead letters, the metrics and health endpoint, secrets, crash points. It
  imports ``ldpipe.schemas`` only.
* ``ldpipe.infra.storage`` — on the same floor: the sketch store and the discoveries store, each
  opened from a use case, and the protocol the services read and commit through. It imports
  ``ldpipe.schemas`` and ``ldpipe.infra.runtime`` (secret references) only.

Beside them, as package data: the example configurations, ``ldpipe init``'s word list and the
Prometheus and Grafana files (``monitoring/``). The layers are a contract ``lint-imports`` checks
(``pyproject.toml``, ``[tool.importlinter]``).
"""
