"""What discovery's devices, aux server, server and configuration agree on: item rules
(``item.py``), the byte layouts (``layers.py``, ``../discovery.md``), tags (``tags.py``), the
release's privacy (``privacy.py``), the discovered item (``discovered.py``), SFP's settings and
encodings (``sfp_words.py``) and the protocol's errors (``exceptions.py``). The services that
run it are ``ldpipe.discovery``.
"""
