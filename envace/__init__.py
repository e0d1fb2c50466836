"""envace: train tool-use agents with world rehearsal, and audit the world model they learn.

Importing this package is light: it imports nothing heavy (no torch). Submodules that need torch
(models, backends, rollout, grpo, train) import it themselves.
"""

__version__ = "0.1.0"
