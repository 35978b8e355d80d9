"""What discovery's devices, aux server, server and configuration agree on: item rules
(``item.py``), the byte layouts (``layers.py``, ``../discovery.md``), tags (``tags.py``), the
release's privacy (``privacy.py``), the discovered item (``discovered.py``), the aux protocol's
device client (``client.py``, GCMS Alg. 5), SFP's settings and encodings (``sfp_words.py``), its
device (``sfp_device.py``, Apple Alg. 9), its puzzle (``sfp_puzzle.py``, Alg. 10, a pure
algorithm the service and the simulation share) and its fragment wire format (``sfp_wire.py``),
and the protocol's errors (``exceptions.py``). The services that run it are ``ldpipe.discovery``.
"""
