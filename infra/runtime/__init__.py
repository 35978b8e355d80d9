"""The floor under every service: Kafka settings, topics and transactions, the embedded broker,
dead letters, the metrics and health endpoint, secret references, parameter epochs and the
privacy ledger on Kafka, crash points. Imports ``ldpipe.schemas`` and libraries only; the
services and the command line stand on it.
"""
