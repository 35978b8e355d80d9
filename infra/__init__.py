"""The ``ldpipe`` command line and (later) the embedded broker runner."""
