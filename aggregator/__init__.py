"""Stateful aggregators and the query worker (the streaming path lands with the pipeline issue).

Today the server-side math (``accumulate``, ``estimate``) lives with each mechanism in
``schemas.mechanisms``; this package will hold the Kafka consumers, snapshots and queries.
"""
