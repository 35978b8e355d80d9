"""The shuffler: strips metadata, permutes windows, republishes exactly-once (pipeline issue)."""
