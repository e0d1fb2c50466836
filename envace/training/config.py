"""The trainer's config: `TrainConfig`, every key of `envace train` with its default, help and
checks. The loading machinery (YAML + `key=value` overrides, type checks, help) is
`envace.training.config_base`; its public names are re-exported here for the callers.

    cfg = load_config(TrainConfig, "configs/tiny.yaml", ["lr=1e-5", "mode=grpo"])
"""

import dataclasses
import difflib
from pathlib import Path
from typing import ClassVar, Literal

from envace.core.envs.task_envs import check_task_env
from envace.core.modes import TRAINING_MODES, modes_help, training_mode
from envace.model.windows import DESC_CHARS
from envace.training.config_base import (  # noqa: F401  (re-exported: the callers' one import)
    ConfigError,
    T,
    _unknown,
    check_ranges,
    check_types,
    coerce,
    config_help,
    dump_yaml,
    load_config,
    opt,
    parse_cli,
    require,
    to_dict,
    type_name,
    valid_keys,
)

# -----------------------------------------------------------------------------
# The trainer's config

Mode = Literal[tuple(TRAINING_MODES)]  # type: ignore[valid-type]  # envace.core.modes


@dataclasses.dataclass
class TrainConfig:
    """Configuration of `envace train` (role-wise GRPO with world rehearsal).

    Defaults follow the EnvACE reference run where it has one (lr 1e-6 constant, 16 prompts x 4
    rollouts, clip 0.2 with dual clip 3, token-mean loss, KL off); presets in configs/ override.
    """

    # keys that were validated and documented but never acted on: a config that sets one is
    # refused with this reason (a run's own older config.yaml drops them on resume)
    REMOVED: ClassVar[dict[str, str]] = {
        "eval_every": "the run evaluates once, after its last step (eval_tasks, eval_split)",
        "log_every": "every step's metrics are logged",
        "resume_from": "resume a run with `envace train --resume runs/<name>`",
    }

    # run
    run_name: str = opt("", "run folder name under output_dir; empty: '<mode>-<model>-s<seed>' "
                        "('-<env>' appended for an env other than bfcl)")
    output_dir: str = opt("runs", "folder that holds run directories")
    seed: int = opt(0, "random seed (task order, sampling, init of the tiny model)")

    # model and method
    model: str = opt("tiny", "policy model: 'tiny', 'smollm2', a local path or a hub id")
    mode: Mode = opt("envace", modes_help())
    world_model: str | None = opt(None, "mode=split: world model spec; null: a copy of `model`")
    simulator_model: str | None = opt(
        None, "mode=simulator: frozen model spec, or a served model: an OpenAI-compatible "
        "endpoint http(s)://HOST:PORT/v1#MODEL (#MODEL may be left out when the server serves "
        "one model; checked before the run goes on)"
    )
    backend: Literal["hf", "vllm"] = opt("hf", "generation backend for rollouts")
    dtype: Literal["auto", "float32", "bfloat16"] = opt("auto", "parameter dtype; auto: model's")
    sharding: Literal["replicate", "fsdp"] = opt(
        "replicate", "several processes: each holds a full replica (replicate, data parallel) or "
        "1/world of the trained weights, gradients and optimizer state (fsdp, "
        "envace.training.fsdp); accelerate's FSDP config sets fsdp. One process: ignored")

    # tasks and reward
    env: str = opt(
        "bfcl", "environment whose tasks the run trains and evaluates on: bfcl (BFCL v4 "
        "multi-turn), agentdojo (AgentDojo v1.2.2 user tasks) or tau2 (τ²-bench airline, retail, "
        "telecom); rollouts, rewards and audits "
        "follow it (envace.core.envs.task_envs)")
    split: str = opt("train", "task split to train on (a file in data/, data/splits/<env>/)")
    train_tasks: int = opt(
        0, "train on a fixed pool of this many tasks of `split` (sampled with the seed); 0: all. "
        "With eval_split equal to split the evaluation uses the same pool (a memorisation check)",
        ge=0, why="0 switches it off")
    task_unit: Literal["turn", "task"] = opt(
        "turn", "train on single user turns (denser reward) or on whole multi-turn tasks; "
        "AgentDojo and τ² tasks are a single user turn, so there both give the same tasks"
    )
    desc_chars: int = opt(DESC_CHARS,
                          "tool descriptions in the prompt's tool listing are cut to this", ge=0)
    reward: Literal["state", "action", "turn_state", "action_partial"] = opt(
        "state",
        "state: final environment state after executing the committed calls equals ground "
        "truth; action: committed calls match ground-truth calls (F1); action_partial: the same "
        "F1 with partial credit for the right function and each right argument; turn_state: "
        "of the user turns whose ground truth makes calls, the share passed in order before "
        "the first failed one (a turn passes the state check: a call made, every backend's "
        "state equal to ground truth, the ground truth's responses returned)",
    )
    grounded_lambda: float = opt(
        0.0, "rehearse reward = (1 - lambda) * task reward + lambda * measured fidelity; 0: paper"
    , ge=0, le=1)
    real_obs_coef: float = opt(
        0.0, "weight of a supervised loss on the step's real tool responses: the token-mean "
        "cross-entropy (temperature 1) of the tokens the real environment wrote (each response's "
        "text and its <|im_end|>), added to the loss of the model that learns the rehearse role "
        "(grpo, envace: the policy; split: the world model) and logged apart (loss/real_obs). "
        "Needs real responses: mode=grpo, or anchor_fraction > 0; 0: off", ge=0, why="0: off")
    anchor_fraction: float = opt(
        0.0, "mode=envace/split: the share of each step's prompt groups rolled out with the real "
        "environment answering instead of rehearsing (whole groups, drawn with the step's seed; "
        "anchor_fraction * prompts_per_step of them in expectation). An anchored group is a "
        "group of its own: its act tokens get the policy loss against its own baseline, its "
        "real responses feed real_obs_coef, it has no rehearse role to train. 0: off", ge=0, le=1)
    rehearse_trust: float | None = opt(
        None, "the confidence gate in rollouts (envace.model.trust): a rehearsed response whose "
        "mean token log-probability is below this is discarded and the call goes to a real "
        "environment of the episode's own instead (marked gated; counted in metrics.jsonl's "
        "calls/gated_real beside calls/rehearsed). A finite number <= 0; needs a rehearsing mode "
        "(envace, split); null: off", le=0, why="a mean token log-probability is never above 0")
    memory_k: int = opt(
        0, "rehearse with a memory of real responses: before each rehearsed response (rollouts "
        "and evaluation), a system note of the memory_k most similar calls of that tool in the "
        "environment's train split and what the real environment returned (audit.worlds.memory; "
        "never the task's own scenario; the note stays in the episode as context). 0: off",
        ge=0, why="0: off")

    # rollouts
    prompts_per_step: int = opt(16, "tasks sampled per training step", ge=1)
    group_size: int = opt(4, "rollouts per task (the GRPO group)",
                          ge=2, why="role-wise baselines compare rollouts of the same task")
    rollout_dtype: Literal["same", "bfloat16"] = opt(
        "same", "backend=hf: the dtype training rollouts decode in. same: the policy itself; "
        "bfloat16: a bf16 copy of it, refreshed after every update (faster decode on CPU, "
        "bench/rollout_engine.py --gen-dtype). The recorded log-probs (the update's old "
        "log-probs) are then the copy's, within the tolerance docs/profiling.md measures of "
        "the fp32 policy's, as with vLLM's bf16 engine; evaluation stays in the policy's dtype")
    rollout_packed_linear: bool = opt(
        True, "backend=hf: training rollouts' large linear layers run on weights packed once per "
        "rollout for oneDNN (CPU, fp32/bf16; docs/profiling.md has what it buys); false: plain "
        "F.linear. The same product in another summation order")
    temperature: float = opt(1.0, "sampling temperature in training",
                             gt=0, why="use a small value, not 0")
    top_p: float = opt(1.0, "nucleus sampling in training", gt=0, le=1)
    max_new_tokens: int = opt(1024, "token cap per generated message (assistant turn or response)",
                              ge=1)
    max_turns: int = opt(30, "assistant turns per episode (the reference stops at 30)", ge=1)
    max_context_tokens: int = opt(20000, "episode ends when its context reaches this many tokens")

    # optimisation
    steps: int = opt(100, "GRPO training steps (one optimizer update each, on fresh rollouts)",
                     ge=0)
    lr: float = opt(1e-6, "learning rate (constant after warmup; paper 1e-6)", gt=0)
    warmup_steps: int = opt(0, "linear learning-rate warmup steps", ge=0)
    weight_decay: float = opt(0.01, "AdamW weight decay", ge=0)
    grad_clip: float = opt(1.0, "max global gradient norm; 0 disables clipping",
                           ge=0, why="0 disables clipping")
    micro_batch_size: int = opt(4, "sequences per forward/backward; gradients accumulate", ge=1)
    clip_low: float = opt(0.2, "PPO ratio clip below: ratio >= 1 - clip_low", ge=0, lt=1)
    clip_high: float = opt(0.2, "PPO ratio clip above: ratio <= 1 + clip_high (>0.2: clip-higher)",
                           ge=0)
    dual_clip: float | None = opt(3.0, "cap on the loss of negative-advantage tokens; null: off",
                                  gt=1, why="3.0 in the paper; null: off")
    kl_coef: float = opt(0.0, "weight of the k3 KL to the initial policy; 0: off (paper 1e-4 on)",
                         ge=0)
    aggregation: Literal["token_mean", "seq_mean", "seq_mean_token_sum"] = opt(
        "token_mean", "loss reduction over tokens and sequences (envace.training.grpo.aggregate)"
    )
    scale_by_std: bool = opt(False, "divide advantages by the group std (paper: no)")

    # cold start
    sft_steps: int = opt(0, "supervised cold-start steps on reference trajectories; 0: none",
                         ge=0, why="0: no cold start")
    sft_lr: float | None = opt(None, "learning rate of the cold start; null: the preset's", gt=0)
    sft_max_minutes: float = opt(5.0, "wall-clock budget of the cold start; 0: none",
                                 ge=0, why="0: no time budget")

    # evaluation, fidelity audit, logging, checkpoints
    eval_split: str = opt("dev", "task split to evaluate on")
    eval_tasks: int = opt(64, "tasks of eval_split per evaluation; 0: all",
                          ge=0, why="0: every task of eval_split")
    eval_seeds: int = opt(1, "samples per evaluation task (pass@k; steadier means)", ge=1)
    eval_temperature: float = opt(0.6, "sampling temperature in evaluation (reference 0.6)",
                                  gt=0, why="use a small value, not 0")
    eval_top_p: float = opt(0.95, "nucleus sampling in evaluation (reference 0.95)", gt=0, le=1)
    audit_scorers: list[str] = opt(
        ["exact", "json_f1", "error_agreement"],
        "fidelity scorers run on rehearsed responses every step (audit registry names); []: off",
    )
    verdict_scorer: str = opt("exact", "scorer whose verdict decides that a step diverged")
    fidelity_nll_every: int = opt(
        0, "every N steps (from step 0, and on the last step before and after its update), log "
        "the bits per byte of real tool responses under the model that rehearses (the policy; "
        "mode=split: the world model) on a fixed held-out batch of real eval_split trajectories "
        "(fidelity_bpb in metrics.jsonl; the likelihood audit's pooled figure, one forward per "
        "trajectory, nothing generated); 0: off", ge=0, why="0: off")
    fidelity_nll_batch: int = opt(
        8, "fidelity_nll_every: how many real eval_split trajectories the held-out batch holds "
        "(whole tasks drawn with a fixed seed, the same for every run and seed)", ge=1)
    report_to: Literal["none", "tensorboard", "wandb"] = opt("none", "metrics sink besides JSONL")
    checkpoint_every: int = opt(100, "save a checkpoint every N steps; 0: only at the end",
                                ge=0, why="0: a checkpoint only at the end")
    time_sync: bool = opt(
        False, "on a GPU, wait for queued kernels at every boundary of the step's timed sections "
        "(time/* in metrics.jsonl): each section's seconds are then its own, at the cost of a "
        "pipeline stall per boundary; off: kernels still running are charged to a later section. "
        "No effect on a CPU")

    def __post_init__(self) -> None:
        check_types(self)
        check_ranges(self)
        require(self.model.strip() != "", "model is empty: set model=tiny, smollm2 or a path")
        self._check_env()
        require(
            self.max_new_tokens < self.max_context_tokens,
            f"max_new_tokens={self.max_new_tokens} must be below max_context_tokens="
            f"{self.max_context_tokens}: raise max_context_tokens or lower max_new_tokens",
        )
        mode = training_mode(self.mode)
        rehearsing = [m.name for m in TRAINING_MODES.values() if m.trains_rehearsals]
        require(
            self.grounded_lambda == 0 or mode.trains_rehearsals,
            f"grounded_lambda={self.grounded_lambda} rewards the policy's rehearsals, which "
            f"mode={self.mode} does not train: set grounded_lambda=0 or mode="
            + "/".join(rehearsing),
        )
        self._check_real_obs()
        self._check_trust()
        require(self.rollout_dtype == "same" or self.backend == "hf",
                f"rollout_dtype={self.rollout_dtype} is for backend=hf; vLLM's engine dtype is "
                "`dtype`")
        require(
            self.memory_k == 0 or mode.trains_rehearsals,
            f"memory_k={self.memory_k} is shown when the policy rehearses, which mode="
            f"{self.mode} does not: set memory_k=0 or mode=" + "/".join(rehearsing),
        )
        require(
            self.grounded_lambda == 0 or bool(self.audit_scorers),
            "grounded_lambda > 0 needs measured fidelity: list scorers in audit_scorers",
        )
        simulated = [m.name for m in TRAINING_MODES.values() if m.rollout == "simulator"]
        require(
            mode.rollout != "simulator" or bool(self.simulator_model),
            f"mode={self.mode} needs simulator_model=<preset | path | "
            "http(s)://HOST:PORT/v1#MODEL endpoint>",
        )
        require(
            mode.rollout == "simulator" or self.simulator_model is None,
            f"simulator_model is only used when mode={'/'.join(simulated)} (mode={self.mode}): "
            f"set simulator_model=null or mode={'/'.join(simulated)}",
        )
        split = [m.name for m in TRAINING_MODES.values() if m.separate_world_model]
        require(
            mode.separate_world_model or self.world_model is None,
            f"world_model is only used when mode={'/'.join(split)} (mode={self.mode}): set "
            f"world_model=null or mode={'/'.join(split)}",
        )
        self._check_scorers()
        require(
            not self.audit_scorers or self.verdict_scorer in self.audit_scorers,
            f"verdict_scorer={self.verdict_scorer!r} is not among audit_scorers="
            f"{self.audit_scorers}: add it there or pick one of them",
        )

    def _check_real_obs(self) -> None:
        """real_obs_coef and anchor_fraction: in range, and real responses to learn from."""
        mode = training_mode(self.mode)
        rehearsing = "/".join(m.name for m in TRAINING_MODES.values() if m.rollout == "rehearse")
        real = "/".join(m.name for m in TRAINING_MODES.values() if m.rollout == "real")
        require(self.anchor_fraction == 0 or mode.rollout == "rehearse",
                f"anchor_fraction={self.anchor_fraction} anchors rehearsed rollouts in reality, "
                f"but mode={self.mode} does not rehearse (its tool responses come from the "
                f"{mode.rollout} rollout): set anchor_fraction=0 or mode={rehearsing}")
        require(self.real_obs_coef == 0 or mode.rollout == "real" or self.anchor_fraction > 0,
                f"real_obs_coef={self.real_obs_coef} trains on the real environment's tool "
                f"responses, but mode={self.mode} with anchor_fraction=0 has none (its responses "
                f"are {'rehearsed' if mode.rollout == 'rehearse' else 'simulated'}): set "
                + ("anchor_fraction > 0, " if mode.rollout == "rehearse" else "")
                + f"mode={real} or real_obs_coef=0")

    def _check_trust(self) -> None:
        """rehearse_trust: a finite log-probability, and rehearsals for it to gate."""
        if self.rehearse_trust is None:
            return
        # lazy: envace.model.trust: only this path needs it
        from envace.model.trust import check_trust

        try:
            check_trust(self.rehearse_trust)
        except ValueError as exc:
            raise ConfigError(f"rehearse_trust={self.rehearse_trust}: {exc}") from None
        rehearsing = "/".join(m.name for m in TRAINING_MODES.values() if m.rollout == "rehearse")
        require(training_mode(self.mode).rollout == "rehearse",
                f"rehearse_trust={self.rehearse_trust} gates rehearsed responses, but mode="
                f"{self.mode} does not rehearse: set rehearse_trust=null or mode={rehearsing}")

    def _check_env(self) -> None:
        """The environment is installed and has task splits with a verifier."""
        try:
            check_task_env(self.env)
        except ValueError as exc:
            raise ConfigError(f"env={self.env}: {exc}") from None

    def _check_scorers(self) -> None:
        """Every listed scorer (and the verdict's) is registered in the audit: a typo fails
        here, not after the model loaded and the first step rolled out."""
        if not self.audit_scorers:
            return
        # lazy: loads rapidfuzz: only this path needs it
        from audit.scoring.scorers import list_scorers

        known = list_scorers()
        for i, name in enumerate(self.audit_scorers):
            close = difflib.get_close_matches(name, known, n=1)
            require(name in known,
                    f"audit_scorers[{i}]={name!r} is not a registered scorer"
                    + (f" (did you mean {close[0]!r}?)" if close else "")
                    + f"; valid: {', '.join(known)}")
        require(self.verdict_scorer in known,
                f"verdict_scorer={self.verdict_scorer!r} is not a registered scorer; valid: "
                f"{', '.join(known)}")

    @property
    def run_dir(self) -> Path:
        """Where this run writes: output_dir / (run_name or '<mode>-<model>-s<seed>', with
        '-<env>' after it for an environment other than bfcl)."""
        name = self.run_name or f"{self.mode}-{Path(self.model).name}-s{self.seed}" + (
            f"-{self.env}" if self.env != "bfcl" else "")
        return Path(self.output_dir) / name
