"""The top floor: the ``ldpipe`` command line (``main.py``) and one module per command.

Each command module has ``add_parser(subparsers)`` and ``run(args)``; ``main.py`` imports one only
when it runs or its help is asked for. ``pipeline.py`` runs a whole pipeline on one machine (the
demo, the integration tests). Nothing below this package imports it.
"""
