"""The bfcl environment family: its record is ``family.py``, its contract
``envace/core/envs/README.md``."""
