"""envace.core: the torch-free floor — trajectory schema, environments, export, rewards, timing
records and the run/audit directory layout.

Rule (tested in tests/test_layering.py): nothing here imports torch, transformers or any other
part of envace; `audit` and `dashboard` may import this package and nothing else of envace.
"""
