"""Unknown-domain item discovery: the aux-server protocol and Apple's SFP (discovery issue)."""
