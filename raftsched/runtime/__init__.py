"""The runtime: node wiring, the trigger loop, the dispatcher, the local cluster."""
