"""The floor every party stands on: what devices, shufflers, aggregators and discovery agree on.

No Kafka, no services: formats, the mechanisms and their math. From the bottom up:

* ``errors.py`` — the exception hierarchy and the reasons reports are refused (imports nothing);
* ``hashing.py`` and ``mechanisms/`` — the hash family and the LDP mechanisms (perturb,
  accumulate, estimate, calibrate);
* the wire formats, each beside its specification (``*.md``): ``payloads.py``, ``envelope.py``,
  ``outer.py``, ``keys.py``, ``headers.py``, ``epochs.py``, ``durable.py``;
* ``privacy/`` (accounting), ``tuning/`` (the advisor, adaptive epochs) and ``discovery/`` (the
  discovery protocol's items, layouts, tags and SFP encodings);
* ``config.py`` — the pipeline configuration, which validates with all of the above.

``pyproject.toml`` (``[tool.importlinter]``) states these layers as a contract ``lint-imports``
checks.
"""
