"""The tau2 environment family (τ²-bench: airline, retail, telecom): its record is
``family.py``, its contract ``envace/core/envs/README.md``, its details docs/tau2.md."""
