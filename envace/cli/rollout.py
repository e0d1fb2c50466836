"""`envace rollout`: episodes in the trajectory format, ready for `envace-audit replay`.

    envace rollout --model PATH [--env bfcl|agentdojo] --split dev --mode rehearse \
        --out dev_rollouts.jsonl [--tasks 20] [--unit turn|task] [--temperature 0.6] \
        [--simulator PATH_OR_URL]
    envace rollout --model PATH --mode simulator --simulator-endpoint http://127.0.0.1:8000/v1 \
        [--simulator-model NAME] [--simulator-api completions|chat] --out FILE.jsonl

`--env` picks the environment whose split is run (default bfcl; agentdojo: its user tasks, each
a single user turn, so `--unit` changes nothing there); in mode real that environment answers.

With `--simulator-endpoint` (or an http(s) `--simulator`) the tool responses come from an
OpenAI-compatible server (`envace.model.simulators.EndpointSimulator`): checked before the policy is
loaded (exit 2 with one line when it is down or does not serve the model), requests retried with
backoff, a request that still fails answered as an error (counted, printed at the end). Each
trajectory's `meta.simulator` names it (`endpoint:<URL>#<model>`).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

from envace.cli.argtypes import count, number
from envace.core.envs.limits import DEFAULT_CALL_TIMEOUT_S, DEFAULT_MEMORY_MB, limit_arg
from envace.core.envs.task_envs import check_task_env, env_tasks
from envace.core.modes import ROLLOUT_MODES
from envace.core.text import terminal_safe
from envace.model.endpoint import EndpointError
from envace.model.models import default_cache_dir, load_model, resolve_model
from envace.model.simulators import connect_endpoint, local_simulator
from envace.model.windows import DESC_CHARS, fitting_tasks


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="run episodes and write trajectories", description=__doc__)
    p.add_argument("--model", required=True, help="tiny, smollm2 or a local model folder")
    p.add_argument("--env", default="bfcl",
                   help="environment of the tasks: bfcl (default), agentdojo or tau2")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    p.add_argument("--mode", default="rehearse", choices=list(ROLLOUT_MODES),
                   help="who answers tool calls: " + "; ".join(
                       f"{k}: {v}" for k, v in ROLLOUT_MODES.items()))
    p.add_argument("--simulator", help="mode simulator: a model folder/preset or an http(s) URL")
    p.add_argument("--simulator-endpoint", help="mode simulator: an OpenAI-compatible server URL")
    p.add_argument("--simulator-model", help="the served model's name (default: the only one)")
    p.add_argument("--simulator-api", default="completions", choices=["completions", "chat"],
                   help="completions: envace's ChatML prompt (default); chat: chat/completions")
    p.add_argument("--simulator-timeout", type=number(0, None, low_open=True), default=60.0,
                   help="seconds per attempt")
    p.add_argument("--simulator-retries", type=count(0, 100), default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--call-timeout", type=limit_arg, default=DEFAULT_CALL_TIMEOUT_S, metavar="S",
                   help="mode real: wall-clock limit of every environment call, C code included "
                        "(the episode's backend runs in a child process that is killed; 0: "
                        "none): a call past it ends its episode (docs/audit.md, limits)")
    p.add_argument("--call-memory-mb", type=limit_arg, default=DEFAULT_MEMORY_MB, metavar="MB",
                   help="mode real: memory an environment call may add (0: no limit)")
    p.add_argument("--tasks", type=count(0), default=0, help="at most this many tasks (0: all)")
    p.add_argument("--unit", default="turn", choices=["turn", "task"],
                   help="BFCL: single user turns or whole multi-turn tasks; AgentDojo tasks are "
                   "single-turn (no difference)")
    p.add_argument("--temperature", type=number(0, None), default=0.6)
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=0.95)
    p.add_argument("--max-new-tokens", type=count(1), default=128)
    p.add_argument("--max-turns", type=count(1), default=8)
    p.add_argument("--max-context", type=count(64), default=4096)
    p.add_argument("--batch-size", type=count(1), default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-k", type=count(0), default=0, metavar="K",
                   help="rehearse with a memory: before each rehearsed response, a note of "
                        "the K most similar calls of the environment's train split and their "
                        "real responses (never the task's own scenario; 0: off)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    try:
        check_task_env(args.env)
        if args.memory_k < 0 or (args.memory_k and args.mode != "rehearse"):
            raise ValueError("--memory-k K (K >= 1) is shown when the policy rehearses: "
                             "--mode rehearse")
    except ValueError as exc:
        print(f"envace rollout: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    endpoint = args.simulator_endpoint or (
        args.simulator if (args.simulator or "").startswith(("http://", "https://")) else None)
    if args.mode == "simulator" and not (args.simulator or endpoint):
        print("envace rollout: --mode simulator needs --simulator PATH_OR_URL or "
              "--simulator-endpoint URL", file=sys.stderr)
        return 2
    sim = None
    if args.mode == "simulator" and endpoint:
        try:
            sim = endpoint_simulator(endpoint, args, DESC_CHARS)
        except (ValueError, EndpointError) as exc:
            print(f"envace rollout: {terminal_safe(str(exc))}", file=sys.stderr)
            return 2
    # the model side (torch) only once the simulator is known to answer
    # lazy: loads numpy: kept out of --help
    from envace.core.rewards import task_reward
    from envace.core.schema import TrajectoryWriter
    from envace.model.rollout import RolloutConfig, run_episodes

    try:
        path = resolve_model(args.model, default_cache_dir()) if args.model != "tiny" else None
    except ValueError as exc:
        print(f"envace rollout: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    if path is None:
        print("envace rollout: give a trained model folder (e.g. runs/<run>/checkpoints/...)",
              file=sys.stderr)
        return 2
    model, tok = load_model(path)
    tasks = fitting_tasks(env_tasks(args.env, args.split, args.unit), tok, args.max_context,
                          args.max_new_tokens)
    if args.tasks and len(tasks) > args.tasks:
        tasks = random.Random(args.seed).sample(tasks, args.tasks)
    if args.mode == "simulator" and sim is None:
        texts = None
        if args.simulator == "tiny":  # the tiny preset's tokenizer is trained on train texts
            # lazy: loads numpy, pydantic, rapidfuzz: kept out of --help
            from envace.training.sft import load_train_trajectories, training_texts

            texts = training_texts(load_train_trajectories())
        sim = local_simulator(args.simulator, args.max_new_tokens, DESC_CHARS, texts)
    rcfg = RolloutConfig(mode=args.mode, temperature=args.temperature, top_p=args.top_p,
                         max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
                         max_context=args.max_context, seed=args.seed,
                         call_timeout_s=args.call_timeout or None,
                         call_memory_mb=int(args.call_memory_mb) or None)
    if args.memory_k:
        # lazy: loads numpy, pydantic, rapidfuzz: kept out of --help
        from audit.worlds.memory import ResponseMemory

        rcfg.memory, rcfg.memory_k = ResponseMemory.from_train_split(args.env), args.memory_k
    n = 0
    with TrajectoryWriter(Path(args.out), mode="w") as w:
        for i in range(0, len(tasks), args.batch_size):
            for ep in run_episodes(model, tok, tasks[i:i + args.batch_size], rcfg, sim):
                r = task_reward("state", ep.task, ep.calls_per_turn, ep.final_text)
                ep.trajectory.reward = float(r["success"])
                ep.trajectory.model = str(path)
                if getattr(sim, "label", None):
                    ep.trajectory.meta["simulator"] = sim.label
                w.write(ep.trajectory)
                n += 1
    print(f"wrote {n} {args.mode} trajectories to {args.out}")
    if getattr(sim, "failures", 0):
        print(f"envace rollout: {sim.failures} of {sim.calls} simulator requests failed; their "
              f"responses are errors (the last: {sim.last_error})", file=sys.stderr)
    return 0


def endpoint_simulator(url: str, args: argparse.Namespace, desc_chars: int) -> Any:
    """A checked `EndpointSimulator` (the model: `--simulator-model`, else the only one served)."""
    try:
        return connect_endpoint(url, args.simulator_model or "", api=args.simulator_api,
                                timeout_s=args.simulator_timeout,
                                max_tokens=args.max_new_tokens,
                                retries=args.simulator_retries, desc_chars=desc_chars)
    except EndpointError as exc:
        if args.simulator_model or "name the one to use" not in str(exc):
            raise
        raise EndpointError(f"{exc} with --simulator-model") from None
