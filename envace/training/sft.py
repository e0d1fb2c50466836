"""Cold start: supervised fine-tuning on real trajectories with trl's SFTTrainer.

    envace sft --preset tiny                          # about 9 minutes on two CPU cores
    envace sft --preset smollm2 --seq-len 1024 --max-minutes 10
    envace sft --preset PATH --roles act --max-steps 200 --out runs/sft-act

The data are the train split's real trajectories (`envace.core.export`: ground-truth calls executed,
one call per assistant message) of BFCL, or of another family with `env` (`--env tau2`: τ²'s three
domains). Every token is trained as its role says (`envace.model.chat`): with
`roles="both"` (default) the assistant turns (ACT) and the tool responses (REHEARSE: the policy
learns to write what the environment answers); with `roles="act"` the tool responses stay context;
with `roles="rehearse"` only the tool responses are trained (a world-model fine-tune, e.g. from an
SFT folder: `envace sft --preset data/models/tiny-sft --roles rehearse`).
With `memory_k=K` every tool response follows a note of the K most similar real calls of the
training data from other scenarios (`audit.worlds.memory`), the note `envace probe --memory` and the
trainer's `memory_k` show: a world model trained to use a memory of real responses. The notes
of earlier responses stay in a window's context, as they stay in an episode with `memory_k`;
the probe shows only the current call's.

Trajectories longer than `seq_len` are cut into windows of whole messages. Every window opens
with the system turn (the tool listing) and, when it starts mid-conversation, the last user message
before it, both as context; a single message that does not fit is cut at its end. Probes and
rollouts build their prompts the same way (`prompt_ids`: the system turn, the latest user message
and as many of the latest messages as fit).

A time budget (`max_minutes`, counted from the start of the command, setup included) stops
training cleanly through a trainer callback before the next step would overrun it; the learning
rate then follows a cosine over the clock (or over the steps, whichever is further along). The
output folder is a normal Hugging Face model folder plus `sft_log.jsonl` (one line per logged
step: loss, learning rate, tokens, wall time) and `envace_sft.json` (settings, data, steps,
tokens, throughput, the command). A folder already trained with the same settings and data is
reused unless `force`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from audit.worlds.memory import ResponseMemory, with_notes_before_responses
from envace.core.envs.family import family, family_names
from envace.core.envs.limits import CallLimits
from envace.core.errors import UsageError
from envace.core.export import export_real
from envace.core.schema import Trajectory, read_trajectories
from envace.core.text import terminal_safe
from envace.model.chat import IM_END, Role, render
from envace.model.models import (
    MARKER,
    SFT_META,
    atomic_dir,
    auto_threads,
    default_cache_dir,
    fingerprint,
    load_model,
    read_marker,
    read_sft_meta,
    resolve_model,
)
from envace.model.windows import make_windows, message_blocks
from envace.training.config import opt, require

SFT_LOG = "sft_log.jsonl"
SFT_VERSION = 1  # bump when the data or the training recipe changes meaning
# which chat roles each `roles` setting trains (the rest of the window is context)
ROLE_SETS: dict[str, frozenset[int]] = {
    "both": frozenset({int(Role.ACT), int(Role.REHEARSE)}),
    "act": frozenset({int(Role.ACT)}),
    "rehearse": frozenset({int(Role.REHEARSE)}),
}

# Per-preset defaults for the fields left at None (a path gets the smollm2 column).
PRESET_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {"lr": 1.5e-3, "seq_len": 2048, "batch_size": 1, "warmup_steps": 20},
    "smollm2": {"lr": 1e-4, "seq_len": 1024, "batch_size": 1, "warmup_steps": 10},
}


@dataclasses.dataclass
class SFTSettings:
    """Configuration of `envace sft` (every None means: the preset's default)."""

    preset: str = opt("tiny", "tiny, smollm2, or the path of a local Hugging Face model folder")
    out: str | None = opt(None, "output folder; default <cache>/sft-<preset>-<roles>-<hash>")
    roles: Literal["both", "act", "rehearse"] = opt(
        "both", "train act and rehearse tokens, act only, or rehearse only (the world model)")
    max_minutes: float = opt(9.0, "wall-clock budget of the whole command; 0 = none")
    max_steps: int = opt(0, "stop after this many optimizer steps; 0 = no limit")
    epochs: float = opt(3.0, "passes over the data (the time budget usually ends training first)")
    lr: float | None = opt(None, "peak learning rate (tiny 1.5e-3, smollm2 1e-4)")
    seq_len: int | None = opt(None, "tokens per training window (tiny 2048, smollm2 1024)")
    batch_size: int | None = opt(None, "windows per optimizer step")
    warmup_steps: int | None = opt(None, "linear warmup steps")
    weight_decay: float = opt(0.01, "AdamW weight decay")
    seed: int = opt(0, "seed of the model init (tiny), the shuffling and the trainer")
    memory_k: int = opt(
        0, "train with a memory of real responses: before every tool response, a note of the "
        "memory_k most similar calls of the training data (never the trajectory's own "
        "scenario), as `envace probe --memory` and `memory_k` show it; 0 = off")
    data: str | None = opt(None, "train on this trajectory JSONL instead of the train split")
    env: str = opt("bfcl", "the environment family whose committed train split is the data "
                   "(bfcl, agentdojo, tau2: its three domains); ignored with data")
    cache_dir: str | None = opt(None, "preset cache; default $ENVACE_CACHE or <repo>/.cache/envace")
    logging_steps: int = opt(10, "log the loss every this many steps")
    threads: int = opt(0, "torch CPU threads; 0 = auto: the cores other processes leave idle")
    force: bool = opt(False, "train again even when the output folder is already up to date")

    def __post_init__(self) -> None:
        require(self.roles in ROLE_SETS,
                f"roles must be one of {', '.join(ROLE_SETS)}, not {self.roles!r}")
        require(self.max_minutes >= 0, "max_minutes must be >= 0 (0 means no time budget)")
        require(self.max_steps >= 0, "max_steps must be >= 0 (0 means no step limit)")
        require(self.epochs > 0, "epochs must be positive")
        require(self.lr is None or self.lr > 0, "lr must be positive")
        require(self.seq_len is None or self.seq_len >= 128, "seq_len must be at least 128")
        require(self.batch_size is None or self.batch_size >= 1, "batch_size must be >= 1")
        require(self.logging_steps >= 1, "logging_steps must be >= 1")
        require(self.threads >= 0, "threads must be >= 0 (0 = auto)")
        require(self.memory_k >= 0, "memory_k must be >= 0 (0 = no memory note)")
        require(self.env in family_names(),
                f"env must be one of {', '.join(family_names())}, not {self.env!r}")

    def resolved(self) -> SFTSettings:
        """A copy with the preset's defaults filled in."""
        base = PRESET_DEFAULTS[preset_kind(self.preset)]
        fill = {k: v for k, v in base.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **fill)


def preset_kind(preset: str) -> str:
    """Which defaults a model takes: `tiny` or `smollm2` (a pretrained model).

    A folder trained by `envace sft` takes the kind it was trained from; a folder built by
    `build_tiny` is tiny; any other folder counts as pretrained.
    """
    if preset in PRESET_DEFAULTS:
        return preset

    meta = read_sft_meta(preset)
    if meta.get("preset_kind") in PRESET_DEFAULTS:
        return str(meta["preset_kind"])
    return "tiny" if read_marker(Path(preset)).get("preset") == "tiny" else "smollm2"


# ---------------------------------------------------------------- data


def sft_messages(traj: Trajectory, roles: str = "both", memory: Any | None = None,
                 memory_k: int = 0) -> list[dict[str, Any]]:
    """The trajectory's messages as dicts; tool responses marked `rehearsed` iff the rehearse
    role is trained (roles `both` or `rehearse`). With a `memory`
    (`audit.worlds.memory.ResponseMemory`) and `memory_k` > 0, each tool response follows the note
    of its call's most similar training calls from other scenarios
    (`audit.worlds.memory.with_notes_before_responses`;
    context)."""
    out = []
    for m in traj.messages:
        d = m.dump()
        if d.get("role") == "tool":
            d["rehearsed"] = int(Role.REHEARSE) in ROLE_SETS[roles]
        out.append(d)
    if memory is not None and memory_k > 0:
        out = with_notes_before_responses(out, traj.tool_steps(), memory, traj.task_id,
                                          memory_k)
    return out


def build_examples(
    tokenizer: Any, trajectories: Sequence[Trajectory], seq_len: int, roles: str = "both",
    memory_k: int = 0,
) -> tuple[list[dict[str, list[int]]], dict[str, int]]:
    """Pre-tokenized SFT examples `{input_ids, assistant_masks}` (1 = trained) and counts.

    `assistant_masks` is trl's name for the loss mask; here it marks the tokens of the trained
    roles (`ROLE_SETS[roles]`). With `memory_k` > 0 the trajectories are also the memory (their
    real calls; a trajectory never sees its own scenario's) and every response follows its note.
    """
    trained = ROLE_SETS[roles]
    memory = None
    if memory_k > 0:
        try:
            memory = ResponseMemory.from_trajectories(trajectories, "the SFT data")
        except UsageError as exc:  # a memory is only ever built from the train split
            raise ValueError(f"memory_k={memory_k}: {exc}") from None
    examples: list[dict[str, list[int]]] = []
    stats = {"trajectories": 0, "windows": 0, "tokens": 0, "act_tokens": 0, "rehearse_tokens": 0}
    for traj in trajectories:
        blocks, kinds = message_blocks(tokenizer, sft_messages(traj, roles, memory, memory_k),
                                       traj.tools)
        stats["trajectories"] += 1
        for ids, rls in make_windows(blocks, kinds, seq_len):
            mask = [int(r in trained) for r in rls]
            if not any(mask):  # e.g. a window of act turns only, with roles="rehearse"
                continue
            examples.append({"input_ids": ids, "assistant_masks": mask})
            stats["windows"] += 1
            stats["tokens"] += len(ids)
            stats["act_tokens"] += sum(r == Role.ACT and r in trained for r in rls)
            stats["rehearse_tokens"] += sum(r == Role.REHEARSE and r in trained for r in rls)
    return examples, stats


def load_train_trajectories(data: str | None = None, env: str = "bfcl",
                            limits: CallLimits | None = None) -> list[Trajectory]:
    """Real trajectories of `env`'s committed train split (ground truth executed, through the
    family registry, every call under ``limits``, default :class:`CallLimits`: a task past them
    is left out, named on stderr), or those of a JSONL file."""
    if data is not None:
        items = list(read_trajectories(data))
        bad = [f"{i.path}:{i.line}: {i.error}" for i in items if i.trajectory is None]
        if bad:
            raise ValueError(f"unreadable training records: {'; '.join(bad[:3])}")
        return [i.trajectory for i in items if i.trajectory is not None]

    skipped: list[tuple[str, str]] = []  # a ground truth past the call limits costs its task
    out = list(export_real(train_tasks(env), limits=limits or CallLimits(), skipped=skipped))
    if skipped:
        print(f"envace: cold start without {len(skipped)} task(s) whose ground truth could not "
              f"be recorded (first: {terminal_safe(skipped[0][0])}: "
              f"{terminal_safe(skipped[0][1][:200])})", file=sys.stderr)
    return out


def train_tasks(env: str = "bfcl") -> list[Any]:
    """The tasks of `env`'s committed train split, from the family registry."""
    return family(env).split_tasks("train", "task")


def training_texts(trajectories: Sequence[Trajectory]) -> list[str]:
    """The rendered trajectories: what the tiny preset's tokenizer is trained on."""
    return [render([m.dump() for m in t.messages], t.tools) for t in trajectories]


# ---------------------------------------------------------------- training


def _callbacks(deadline: float | None, log_path: Path, t0: float) -> list[Any]:
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        """Stop before the next step would end past the deadline (the model is saved after)."""

        def __init__(self) -> None:
            self.last = time.perf_counter()
            self.step_s = 0.0
            self.stopped = False

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            self.step_s, self.last = now - self.last, now
            if deadline is not None and now + 1.5 * self.step_s >= deadline:
                self.stopped = True
                control.should_training_stop = True

    class LogLines(TrainerCallback):
        """Append every log (loss, lr, tokens) with the step and wall time to sft_log.jsonl."""

        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            row = {"step": state.global_step, "wall_s": round(time.perf_counter() - t0, 2),
                   **{k: v for k, v in (logs or {}).items() if isinstance(v, int | float)}}
            self.rows.append(row)
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    return [TimeBudget(), LogLines()]


def _clock_lambda(warmup: int, total_steps: int, deadline: float | None) -> Any:
    """LR factor: linear warmup, then a cosine to 10 % over max(step, clock) progress.

    The clock starts at the first call (when the scheduler is made, as training starts) and runs
    to `deadline`.
    """
    start: list[float] = []

    def factor(step: int) -> float:
        if not start:
            start.append(time.perf_counter())
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, total_steps - warmup)
        if deadline is not None:
            budget = max(1e-6, deadline - start[0])
            done = max(done, (time.perf_counter() - start[0]) / budget)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    return factor


def data_fingerprint(trajectories: Sequence[Trajectory]) -> str:
    return fingerprint((t.to_json() for t in trajectories), "sft-data")


def build_trainer(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Mapping[str, list[int]]],
    s: SFTSettings,
    output_dir: Path,
    callbacks: Sequence[Any] = (),
    lr_factor: Any = None,
    quiet: bool = True,
) -> Any:
    """trl's SFTTrainer over pre-tokenized examples; `lr_factor(step)` replaces the scheduler.

    trl turns each example's `assistant_masks` into `labels` (-100 where the mask is 0) when it
    prepares the dataset, so `trainer.train_dataset["labels"]` shows exactly what is trained.
    """
    import datasets
    import torch
    from torch.optim.lr_scheduler import LambdaLR
    from trl import SFTConfig, SFTTrainer

    s = s.resolved()
    if quiet:
        datasets.disable_progress_bars()
    cfg = SFTConfig(
        output_dir=str(output_dir), per_device_train_batch_size=s.batch_size,
        learning_rate=s.lr, weight_decay=s.weight_decay, num_train_epochs=s.epochs,
        max_steps=s.max_steps or -1, logging_steps=s.logging_steps, save_strategy="no",
        report_to=[], bf16=False, gradient_checkpointing=False, max_length=s.seq_len,
        seed=s.seed, data_seed=s.seed, dataloader_num_workers=0,
        include_num_input_tokens_seen="non_padding", disable_tqdm=quiet,
        use_cpu=not torch.cuda.is_available(),
    )

    class Trainer(SFTTrainer):
        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None and lr_factor is not None:
                self.lr_scheduler = LambdaLR(optimizer or self.optimizer, lr_factor)
            return super().create_scheduler(num_training_steps, optimizer)

    dataset = datasets.Dataset.from_list([dict(e) for e in examples])
    return Trainer(model=model, args=cfg, train_dataset=dataset, processing_class=tokenizer,
                   callbacks=list(callbacks))


def _sft_target(s: SFTSettings, trajs: Sequence[Trajectory]) -> tuple[Path, str, str, Path]:
    """``(base model folder, data fingerprint, run fingerprint, output folder)``: what the cold
    start starts from and where it goes (the folder's name holds the fingerprint of the data,
    the base and the recipe, so the same settings never train twice)."""
    cache = Path(s.cache_dir) if s.cache_dir else default_cache_dir()
    data_key = data_fingerprint(trajs)
    texts = training_texts(trajs) if s.preset == "tiny" else None
    base = resolve_model(s.preset, cache, texts)
    recipe = {k: v for k, v in dataclasses.asdict(s).items()
              # env names the data, which data_key already covers
              if k not in ("out", "cache_dir", "force", "data", "env", "threads", "logging_steps")}
    key = fingerprint([data_key, str(base)], {"recipe": recipe, "version": SFT_VERSION})
    out = Path(s.out) if s.out else cache / f"sft-{Path(s.preset).name}-{s.roles}-{key[:10]}"
    return base, data_key, key, out


def _deadline(s: SFTSettings, t0: float, n_params: int) -> float | None:
    """When training must stop for the folder to be saved within the time budget (None: no
    budget): 3 s, plus about 5 per 100M parameters (float32 shards), kept for saving."""
    budget = s.max_minutes * 60 if s.max_minutes else None
    return t0 + budget - 3.0 - 5.0 * n_params / 1e8 if budget else None


def _sft_meta(s: SFTSettings, base: Path, data_key: str, stats: dict[str, Any], n_params: int,
              state: Any, result: Any, rows: list[dict[str, Any]], stop: str, train_s: float,
              losses: tuple[float, float | None, int], t0: float, threads: int,
              load0: list[float], command: list[str] | None) -> dict[str, Any]:
    """The folder's ``envace_sft.json``: how it was made, what it saw and what it measured."""
    logged = [r["loss"] for r in rows if "loss" in r]
    seen = int(state.num_input_tokens_seen or 0)
    loss0, loss1, probe_windows = losses
    return {
        "schema": "envace.training.sft/1",
        "preset": s.preset,
        "preset_kind": preset_kind(s.preset),
        "base_model": str(base),
        "settings": dataclasses.asdict(s),
        "data": {"source": s.data or f"{s.env} train split (real trajectories)",
                 "fingerprint": data_key, **stats},
        "num_parameters": n_params,
        "steps": state.global_step,
        "epochs_done": state.epoch,
        "stopped_by": stop,
        "tokens_seen": seen,
        "train_seconds": round(train_s, 2),
        "wall_seconds": round(time.perf_counter() - t0, 2),
        "tokens_per_s": round(seen / train_s, 1) if train_s > 0 else None,
        "initial_loss": loss0,
        "final_loss": loss1,
        "loss_probe_windows": probe_windows,
        "first_logged_loss": logged[0] if logged else None,
        "final_logged_loss": logged[-1] if logged else None,
        "train_loss": result.training_loss,
        "loss_curve": [[r["step"], r["loss"]] for r in rows if "loss" in r],
        "command": command if command is not None else sys.argv,
        "torch_threads": threads,
        "load_average_at_start": load0,
        "load_average_at_end": list(os.getloadavg()),
    }


def run_sft(
    settings: SFTSettings,
    trajectories: Sequence[Trajectory] | None = None,
    command: list[str] | None = None,
    t0: float | None = None,
    quiet: bool = False,
) -> Path:
    """Train and save; returns the output folder. `t0`: when the budget started counting."""
    import torch


    t0 = time.perf_counter() if t0 is None else t0
    load0 = list(os.getloadavg())
    s = settings.resolved()
    trajs = (list(trajectories) if trajectories is not None
             else load_train_trajectories(s.data, s.env))
    require(bool(trajs), "no training trajectories")
    base, data_key, key, out = _sft_target(s, trajs)
    if not s.force and _marker_fingerprint(out) == key:
        if not quiet:
            print(f"envace sft: {out} is up to date (same settings and data); --force to retrain")
        return out

    threads = auto_threads(s.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(s.seed)
    if s.force:  # else atomic_dir keeps the folder already there (same fingerprint)
        (out / MARKER).unlink(missing_ok=True)
    model, tokenizer = load_model(base)
    examples, stats = build_examples(tokenizer, trajs, s.seq_len, s.roles, s.memory_k)
    require(bool(examples), "no training window holds a trained token")
    n_params = sum(p.numel() for p in model.parameters())
    deadline = _deadline(s, t0, n_params)
    total = s.max_steps or math.ceil(math.ceil(len(examples) / s.batch_size) * s.epochs)
    warmup = min(s.warmup_steps, max(1, total // 10))
    probe_set = examples[: min(len(examples), 16)]
    start = time.perf_counter()
    loss0 = mean_loss(model, probe_set)
    loss_s = time.perf_counter() - start
    # training stops early enough for the same loss measurement after it
    train_deadline = deadline - 1.2 * loss_s if deadline is not None else None
    with atomic_dir(out) as tmp:
        log_path = tmp / SFT_LOG
        log_path.write_text("")
        budget_cb, log_cb = cbs = _callbacks(train_deadline, log_path, t0)
        trainer = build_trainer(model, tokenizer, examples, s, tmp / "trainer", cbs,
                                _clock_lambda(warmup, total, train_deadline), quiet)
        train_start = time.perf_counter()
        result = trainer.train()
        train_s = time.perf_counter() - train_start
        in_time = deadline is None or time.perf_counter() + loss_s < deadline
        loss1 = mean_loss(model, probe_set) if in_time else None
        model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(IM_END)
        trainer.save_model(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        state = trainer.state
        stop = ("time budget" if budget_cb.stopped else
                "max_steps" if s.max_steps and state.global_step >= s.max_steps else "epochs")
        meta = _sft_meta(s, base, data_key, stats, n_params, state, result, log_cb.rows, stop,
                         train_s, (loss0, loss1, len(probe_set)), t0, threads, load0, command)
        (tmp / SFT_META).write_text(json.dumps(meta, indent=1) + "\n")
        marker = {"preset": "sft", "fingerprint": key, "base": str(base),
                  "num_parameters": meta["num_parameters"]}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        shutil.rmtree(tmp / "trainer", ignore_errors=True)
        (tmp / "training_args.bin").unlink(missing_ok=True)  # a pickle; envace_sft.json says it
    if not quiet:
        print(f"envace sft: {state.global_step} steps, {meta['tokens_seen']} tokens in "
              f"{train_s:.0f} s ({meta['tokens_per_s']} tokens/s), stopped by {stop}; loss "
              f"{loss0:.3f} -> {meta['final_logged_loss']}; saved {out}")
    return out


def _marker_fingerprint(folder: Path) -> str | None:
    return read_marker(folder).get("fingerprint") if (folder / SFT_META).is_file() else None


def mean_loss(model: Any, examples: Sequence[Mapping[str, list[int]]]) -> float:
    """Mean cross-entropy per trained token (mask 1) over `examples`, one at a time, no grad."""
    import torch

    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([ex["input_ids"]])
            mask = torch.tensor([ex["assistant_masks"]], dtype=torch.bool)
            logits = model(input_ids=ids).logits[:, :-1].float()
            target, keep = ids[:, 1:], mask[:, 1:]
            if not keep.any():
                continue
            nll = torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum")
            total += float(nll)
            count += int(keep.sum())
    model.train(was_training)
    return total / count if count else float("nan")
