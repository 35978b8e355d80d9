"""The client side: datasets of simulated devices and the in-memory simulation harness."""
