"""Generation backends: ``hf`` (transformers, kept KV cache) and ``vllm`` (in-process vLLM).

The protocol and the message-level episode loop are in ``envace.model.backends.base``; the vLLM
engine and its weight sync in ``envace.model.backends.vllm_backend`` (needs the ``.venv-vllm``
environment from ``scripts/setup_vllm.sh``; the trainer on it is ``envace.training.vllm_train``).
Importing this package imports nothing heavy.
"""
