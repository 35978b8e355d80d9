"""What every party must agree on: the hash family, the mechanisms and their payloads."""
