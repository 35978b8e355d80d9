"""The gateway: the only service devices talk to (``ldpipe gateway``, docs/gateway.md)."""
