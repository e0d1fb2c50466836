"""What a training run is made of: the policy (and world model, simulator, the KL references),
its optimizers and schedulers, the training tasks; built fresh or restored from a checkpoint.

The KL reference of each trainee (``kl_coef > 0``) is its own weights at the start of the run:
a fresh run writes them once into the run directory (``initial_model/``, and
``initial_world_model/`` for a separate ``world_model`` in mode ``split``) and a resumed run
reads them back, so the anchor never moves to the checkpoint it resumes from.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from envace.core.envs.bfcl.tasks import Task
from envace.core.envs.limits import CallLimits
from envace.core.envs.task_envs import env_tasks
from envace.core.errors import UsageError
from envace.core.infile import read_small_text
from envace.core.layout import RUN
from envace.core.modes import training_mode
from envace.core.text import terminal_safe
from envace.core.yaml_load import load_yaml
from envace.model.endpoint import EndpointError
from envace.model.models import default_cache_dir, load_model, mark_weights_changed, resolve_model
from envace.model.simulators import connect_endpoint, local_simulator, split_endpoint_spec
from envace.model.windows import fitting_tasks
from envace.training.checkpoint import save_checkpoint
from envace.training.config import ConfigError, TrainConfig, to_dict
from envace.training.distributed import Dist
from envace.training.grpo import ROLE_NAMES

# the folders in the run directory that hold each trainee's initial weights (the KL anchors)
INITIAL_FOLDERS = {"policy": RUN.initial_model, "world_model": RUN.initial_world_model}

# keys that may differ between a run and its resumption (removed keys: an older run's
# config.yaml may still hold them)
RESUMABLE_CHANGES = {"steps", "checkpoint_every", "report_to", "time_sync", *TrainConfig.REMOVED}
# token role by its name in the mode table
ROLE_IDS = {name: role for role, name in ROLE_NAMES.items()}


@dataclass
class Policy:
    model: Any
    tokenizer: Any
    path: Path
    world_model: Any | None = None
    simulator: Any | None = None
    # the frozen KL anchor of each trainee, by name (policy, world_model); empty when kl_coef=0
    references: dict[str, Any] = field(default_factory=dict)
    optimizers: dict[str, Any] = field(default_factory=dict)
    schedulers: dict[str, Any] = field(default_factory=dict)
    rollout: Any | None = None  # run_episodes' signature on another backend (vLLM); None: HF
    # sharded twins of the trained models (sharding=fsdp, envace.training.fsdp): the loss runs on
    # these;
    # `model` / `world_model` stay whole, for generation, refreshed after every step
    sharded: dict[str, Any] = field(default_factory=dict)
    # memory_k > 0: the train split's real responses (audit.worlds.memory)
    memory: Any | None = None

    def run_episodes(self, *args: Any, **kwargs: Any) -> Any:
        # lazy: loads transformers: only this path needs it
        from envace.model.rollout import run_episodes

        return (self.rollout or run_episodes)(*args, **kwargs)

    def close(self) -> None:
        if self.rollout is not None and hasattr(self.rollout, "close"):
            self.rollout.close()

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def whole(self, name: str) -> Any:
        """The whole (generating) model called ``name``: policy or world_model."""
        return self.model if name == "policy" else self.world_model

    def trainees(self, mode: str) -> list[tuple[str, Any, tuple[int, ...]]]:
        """(name, model the loss runs on, roles it trains) for this mode (envace.core.modes)."""
        return [(n, self.sharded.get(n, self.whole(n)), tuple(ROLE_IDS[r] for r in roles))
                for n, roles in training_mode(mode).models().items()]

    def after_step(self, name: str) -> None:
        """After an optimizer step: the whole model catches up with its sharded twin, and is
        marked changed (`mark_weights_changed`: what a rollout backend syncs on)."""
        if name in self.sharded:
            # lazy: FSDP only under a sharded launch (torch.distributed.fsdp)
            from envace.training.fsdp import refresh

            refresh(self.whole(name), self.sharded[name])
        mark_weights_changed(self.whole(name))

    def save(self, run_dir: Path, step: int, extra: dict[str, Any],
             dist: Dist = Dist()) -> Path | None:
        """A checkpoint, written by rank 0. Under FSDP every rank must call this (gathering
        the optimizer state is collective); otherwise only rank 0 needs to."""
        if self.sharded:
            # lazy: FSDP only under a sharded launch (torch.distributed.fsdp)
            from envace.training.fsdp import optimizer_state

            opt_states = {n: optimizer_state(self.sharded[n], o)
                          for n, o in self.optimizers.items()}
        else:
            opt_states = {n: o.state_dict() for n, o in self.optimizers.items()}
        if not dist.is_main:
            return None
        models = {"policy": self.model}
        if self.world_model is not None:
            models["world_model"] = self.world_model
        return save_checkpoint(run_dir, step, models, self.tokenizer, opt_states,
                               self.schedulers, {**extra, "sharded": bool(self.sharded)})


def training_tasks(cfg: TrainConfig) -> list[Task]:
    """The tasks of ``split`` in the run's environment, in its unit (per-turn BFCL tasks with
    ``task_unit=turn``; AgentDojo's are single-turn whatever the unit)."""
    return env_tasks(cfg.env, cfg.split, cfg.task_unit)


def training_pool(cfg: TrainConfig, tokenizer: Any) -> list[Task]:
    """The tasks a run trains on: those of `split` that fit, or a fixed seeded pool of them."""
    import random

    tasks = fitting_tasks(training_tasks(cfg), tokenizer, cfg.max_context_tokens,
                          cfg.max_new_tokens, cfg.desc_chars)
    if cfg.train_tasks and len(tasks) > cfg.train_tasks:
        tasks = random.Random(cfg.seed).sample(tasks, cfg.train_tasks)
    return tasks


def _train_texts() -> list[str]:
    # lazy: loads pydantic, rapidfuzz: only this path needs it
    from envace.training.sft import load_train_trajectories, training_texts

    return training_texts(load_train_trajectories())


def sft_trajectories(cfg: TrainConfig) -> list[Any] | None:
    """The cold start's data: the real trajectories of the run environment's train split (None:
    BFCL's, which ``run_sft`` loads itself)."""
    if cfg.env == "bfcl":
        return None
    # lazy: loads pydantic: only this path needs it
    from envace.core.export import export_env

    skipped: list[tuple[str, str]] = []  # a ground truth past the call limits costs its task
    out = list(export_env(cfg.env, [t.id for t in env_tasks(cfg.env, "train")],
                          limits=CallLimits(), skipped=skipped))
    if skipped:
        print(f"envace train: cold start without {len(skipped)} task(s) whose ground truth could "
              f"not be recorded (first: {terminal_safe(skipped[0][0])}: "
              f"{terminal_safe(skipped[0][1][:200])})", file=sys.stderr)
    return out


def initial_model_path(cfg: TrainConfig, run_dir: Path, progress: bool) -> Path:
    """The policy to start from: the preset (or path), after the cold start if asked (on the
    real trajectories of the run environment's train split)."""
    cache = default_cache_dir()
    if cfg.sft_steps > 0:
        # lazy: loads pydantic, rapidfuzz: only this path needs it
        from envace.training.sft import SFTSettings, run_sft

        settings = SFTSettings(preset=cfg.model, out=str(run_dir / "sft"), max_steps=cfg.sft_steps,
                               max_minutes=cfg.sft_max_minutes, lr=cfg.sft_lr, seed=cfg.seed)
        if progress:
            print(f"[train] cold start: SFT of {cfg.model} for up to {cfg.sft_steps} steps / "
                  f"{cfg.sft_max_minutes} min on {cfg.env} train", flush=True)
        return Path(run_sft(settings, trajectories=sft_trajectories(cfg), quiet=not progress))
    texts = _train_texts() if cfg.model == "tiny" else None
    return resolve_model(cfg.model, cache, texts=texts)


def _optim(model: Any, cfg: TrainConfig, fused: bool = False) -> tuple[Any, Any]:
    """AdamW and its schedule; with `fused`, torch's fused AdamW kernel (one kernel for all
    parameters: about 4x faster than the per-tensor loop on one CPU thread for SmolLM2's 272
    tensors) where torch has it for these parameters, else the default. The fused kernel does
    not bump the parameters' version counters, so the trainer says after every step that the
    weights changed (`Policy.after_step` -> `mark_weights_changed`), which the vLLM backend's
    `weights_version` reads. Sharded (FSDP) models keep the default."""
    opt = None
    if fused:
        try:
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr,
                                    weight_decay=cfg.weight_decay, fused=True)
        except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
            opt = None
    if opt is None:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warm = max(cfg.warmup_steps, 0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    return opt, sched


def anchored(cfg: TrainConfig) -> list[str]:
    """The trainees whose initial weights the run keeps as KL anchors (``INITIAL_FOLDERS``):
    none when ``kl_coef`` is 0; the world model only when it is a separate model (in mode
    ``split`` without ``world_model`` it starts as a copy of the policy: the same anchor)."""
    if cfg.kl_coef <= 0:
        return []
    separate = training_mode(cfg.mode).separate_world_model and cfg.world_model
    return ["policy", "world_model"] if separate else ["policy"]


def check_anchors(cfg: TrainConfig, run_dir: Path) -> None:
    """Refuse to resume with ``kl_coef > 0`` a run that lacks its initial weights (made before
    the trainer kept them): it would anchor the KL to the checkpoint instead."""
    for name in anchored(cfg):
        folder = run_dir / INITIAL_FOLDERS[name]
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"{run_dir} has no {folder.name}/ (the {name}'s initial weights, the KL anchor; "
                f"runs made before the trainer kept them lack it): resuming with "
                f"kl_coef={cfg.kl_coef} would anchor the KL to the checkpoint instead. Copy the "
                f"model the run started from into {folder} to resume, or start a new run")


def write_initial(run_dir: Path, name: str, model: Any, tokenizer: Any) -> Path:
    """Save ``model`` (and ``tokenizer``) as the run's initial ``name`` (``INITIAL_FOLDERS``),
    atomically: into a temporary folder, then renamed into place."""
    final = run_dir / INITIAL_FOLDERS[name]
    tmp = run_dir / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def build_policy(cfg: TrainConfig, run_dir: Path, state: dict[str, Any] | None,
                 progress: bool = True, dist: Dist = Dist(),
                 simulator: Any | None = None) -> Policy:
    """The models, optimizers and schedulers of a run: fresh, or from ``state``
    (``load_latest``). With ``kl_coef > 0`` a fresh run writes each anchored trainee's initial
    weights into ``run_dir`` (rank 0) and a resumed one requires them (``check_anchors``).
    ``simulator``: mode ``simulator``'s simulator when the caller made it (``served_simulator``);
    else it is made here."""
    torch.manual_seed(cfg.seed)
    if state is not None:  # resume: weights from the checkpoint
        check_anchors(cfg, run_dir)
        folder = state["folder"]
        loaded_from = folder / "policy"
        model, tok = load_model(loaded_from)
        # the model the run started from (what its trajectories name), as the checkpoint says
        path = Path(state["info"].get("initial_model", loaded_from))
        wm = load_model(folder / "world_model")[0] if (folder / "world_model").exists() else None
    else:
        if not dist.is_main:  # rank 0 makes (SFT, tiny build) or finds the model first
            dist.barrier()
        path = loaded_from = initial_model_path(cfg, run_dir, progress)
        if dist.is_main:
            dist.barrier()
        model, tok = load_model(path)
        wm = None
        if training_mode(cfg.mode).separate_world_model:
            wm = load_model(resolve_model(cfg.world_model, default_cache_dir()))[0] \
                if cfg.world_model else copy.deepcopy(model)
        if dist.is_main:  # the KL anchors, before any step changes the weights
            run_dir.mkdir(parents=True, exist_ok=True)
            for name in anchored(cfg):
                write_initial(run_dir, name, model if name == "policy" else wm, tok)
        dist.barrier()
    device = dist.device() if torch.cuda.is_available() else None
    if device is not None:  # one device per process; multi-GPU: see README, Scaling
        model = model.to(device)
        wm = wm.to(device) if wm is not None else None
    policy = Policy(model, tok, Path(path), world_model=wm)
    if cfg.memory_k > 0:
        # lazy: loads pydantic, rapidfuzz: only this path needs it
        from audit.worlds.memory import ResponseMemory

        policy.memory = ResponseMemory.from_train_split(cfg.env)
    if cfg.backend == "vllm":  # engines start lazily, on the first rollout
        # lazy: the vLLM lane only (config backend=vllm)
        from envace.model.backends.vllm_backend import VLLMRollouts

        policy.rollout = VLLMRollouts.for_config(cfg, model_path=loaded_from)
    for name in anchored(cfg):  # each trainee's own anchor, read back from the run directory
        ref = load_model(run_dir / INITIAL_FOLDERS[name])[0].eval().requires_grad_(False)
        policy.references[name] = ref.to(device) if device is not None else ref
    if cfg.kl_coef > 0 and training_mode(cfg.mode).separate_world_model \
            and "world_model" not in policy.references:
        policy.references["world_model"] = policy.references["policy"]  # it started as a copy
    if training_mode(cfg.mode).rollout == "simulator":
        policy.simulator = simulator if simulator is not None else make_simulator(cfg)
    if dist.fsdp and dist.active:
        # lazy: FSDP only under a sharded launch (torch.distributed.fsdp)
        from envace.training.fsdp import shard

        for name, m, _ in policy.trainees(cfg.mode):
            policy.sharded[name] = shard(m, dist)
    for name, m, _ in policy.trainees(cfg.mode):
        m.train()
        policy.optimizers[name], policy.schedulers[name] = _optim(
            m, cfg, fused=name not in policy.sharded)
    if state is not None:
        if bool(state["info"].get("sharded")) != bool(policy.sharded):
            raise ConfigError("the checkpoint was saved with another sharding (its optimizer "
                              "state is laid out differently): resume with the same launch")
        for name, sd in state["optimizers"].items():
            if policy.sharded:
                # lazy: FSDP only under a sharded launch (torch.distributed.fsdp)
                from envace.training.fsdp import load_optimizer_state

                load_optimizer_state(policy.sharded[name], policy.optimizers[name], sd)
            else:
                policy.optimizers[name].load_state_dict(sd)
        for name, sd in state["schedulers"].items():
            policy.schedulers[name].load_state_dict(sd)
    return policy


def served_simulator(cfg: TrainConfig) -> Any | None:
    """Mode ``simulator`` with ``simulator_model=http://HOST:PORT/v1#MODEL``: the checked
    endpoint simulator (an OpenAI-compatible server; without ``#MODEL`` its only model), or
    ConfigError when the server is down or does not serve MODEL. None for every other config.
    Cheap (one request), so the trainer asks before it writes anything into the run directory."""
    spec = cfg.simulator_model or ""
    if training_mode(cfg.mode).rollout != "simulator" or \
            not spec.startswith(("http://", "https://")):
        return None

    url, model = split_endpoint_spec(spec)
    try:
        return connect_endpoint(url, model, max_tokens=cfg.max_new_tokens,
                                desc_chars=cfg.desc_chars)
    except (EndpointError, ValueError) as exc:
        raise ConfigError(f"simulator_model={spec}: {exc}") from None


def make_simulator(cfg: TrainConfig) -> Any:
    """The simulator of mode ``simulator``: a served one (``served_simulator``), or a frozen
    local model (preset or path)."""
    served = served_simulator(cfg)
    if served is not None:
        return served
    spec = cfg.simulator_model or ""
    texts = _train_texts() if spec == "tiny" else None
    return local_simulator(spec, cfg.max_new_tokens, cfg.desc_chars, texts)


def check_same_config(run_dir: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a run directory made by a different configuration."""
    new = to_dict(cfg)
    # a key the old config lacks (added to the trainer since) had its default value then
    stored = run_dir / RUN.config
    try:
        old = {**to_dict(TrainConfig()),
               **(load_yaml(read_small_text(stored, what="config"), str(stored)) or {})}
    except (ValueError, TypeError, OSError, UsageError) as exc:  # YamlError, not a mapping
        raise ConfigError(f"cannot resume {run_dir}: {exc}") from None
    # output_dir is where the run is, named by the --resume path itself: "runs", "./runs" and
    # "/abs/runs" (or the same from another directory) are one run
    diff = sorted(k for k in set(old) | set(new)
                  if k not in RESUMABLE_CHANGES and k != "output_dir"
                  and old.get(k) != new.get(k))
    if diff:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
        raise ConfigError(f"{run_dir} was made by another configuration ({shown}); resume it "
                          "with its own config, or start a new run with run_name=...")
