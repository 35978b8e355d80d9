"""The aggregators (``service``: decrypt, validate, accumulate, snapshot), their snapshots
(``snapshot``), deduplication and time windows, and the query worker (``query``).

The server-side math of each mechanism (``accumulate``, ``estimate``) lives with it in
``ldpipe.schemas.mechanisms``; ``docs/aggregator.md`` and ``docs/query.md`` are the guides.
"""
