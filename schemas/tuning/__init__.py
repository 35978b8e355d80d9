"""Choosing parameters: the advisor (``advisor.py``, ``ldpipe params``) and the next parameter
epoch for a frequency range (``adaptive.py``, ``ldpipe adapt``). Above the mechanisms, which it
evaluates; below every service.
"""
