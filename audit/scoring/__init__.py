"""How a recorded response is scored against the real one: scorers, canonical forms, settings."""
