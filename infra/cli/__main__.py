"""``python -m ldpipe.infra.cli``: the ``ldpipe`` command."""

from ldpipe.infra.cli.main import entry

entry()
