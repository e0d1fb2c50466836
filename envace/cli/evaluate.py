"""`envace eval`: task success in the real environment, with or without test-time rehearsal.

    envace eval --model PATH [--env bfcl|agentdojo] --split dev [--tasks 40] [--seeds 2]
                [--unit turn|task] [--rehearsal none|parallel|sequential] [--n 2] [--out DIR]
                [--world self|hybrid|ranker|oracle] [--trust-above C]

`--env` picks the environment (default bfcl): its split, its real backend and its task check
(BFCL's state check; AgentDojo's own checker of each user task, which is a single user turn, so
`--unit` changes nothing there).

Writes DIR/trajectories.jsonl (commits with ``meta.plan = "commit"`` and the memory they saw;
with rehearsal, also every plan with ``meta.plan = "rehearsal_<i>"``), DIR/summary.json
(success with a Wilson interval, pass@k over seeds, per backend, a budget per task, the audit of
the rehearsals and how plan fidelity relates to committed success, and `calls`: the real calls the
commits and plans used, the plans' rehearsed calls and those the trust gate sent to reality) and
DIR/audit/ (the plans' rehearsed responses replayed against the real environment).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envace.cli.argtypes import count
from envace.core.envs.limits import DEFAULT_CALL_TIMEOUT_S, DEFAULT_MEMORY_MB, limit_arg
from envace.core.envs.task_envs import check_task_env
from envace.core.layout import RUN
from envace.core.rewards import REWARDS
from envace.core.text import terminal_safe
from envace.model.models import default_cache_dir, load_model, resolve_model


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="evaluate in the real environment (optionally rehearsing)",
                       description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--env", default="bfcl",
                   help="environment of the tasks: bfcl (default), agentdojo or tau2")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    p.add_argument("--tasks", type=count(0), default=40, help="at most this many tasks (0: all)")
    p.add_argument("--seeds", type=count(1), default=1)
    p.add_argument("--unit", default="turn", choices=["turn", "task"],
                   help="BFCL: single user turns or whole multi-turn tasks; AgentDojo tasks are "
                   "single-turn (no difference)")
    p.add_argument("--rehearsal", default="none", choices=["none", "parallel", "sequential"])
    p.add_argument("--n", type=count(1), default=2, help="rehearsed plans per task")
    p.add_argument("--reward", default="state", choices=list(REWARDS))
    p.add_argument("--max-new-tokens", type=count(1), default=128)
    p.add_argument("--max-context", type=count(64), default=4096)
    p.add_argument("--max-memory-tokens", type=count(0), default=768)
    p.add_argument("--memory-k", type=count(0), default=0, metavar="K",
                   help="rehearse with a memory: before each rehearsed response, a note of "
                        "the K most similar calls of the environment's train split and their "
                        "real responses (never the task's own scenario; 0: off)")
    p.add_argument("--world", default="self", choices=["self", "hybrid", "ranker", "oracle"],
                   help="who answers the rehearsed plans' calls: self (the policy: the "
                        "method), hybrid (the lookup's exact answer from the environment's "
                        "train split where it has one, the policy elsewhere), ranker (the "
                        "learned ranker's pick among the train split's real responses and "
                        "their copy-edits, audit.worlds.ranker) or oracle (a "
                        "private copy of the real environment per plan: an upper bound, not "
                        "a method)")
    p.add_argument("--trust-above", type=trust_arg, default=None, metavar="C",
                   help="the confidence gate: a plan's rehearsal is kept only where its mean "
                        "token log-probability is >= C (a finite number <= 0); below it the call "
                        "goes to a private real environment of the plan instead, counted as a "
                        "real call (summary `calls`; envace.model.trust). Needs --rehearsal "
                        "parallel or sequential and a world where the policy writes responses")
    p.add_argument("--out", help="output folder (default "
                   "runs/eval-[<env>-]<split>-<rehearsal>-n<N>[-<world>][-trust<C>])")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--call-timeout", type=limit_arg, default=DEFAULT_CALL_TIMEOUT_S, metavar="S",
                   help="wall-clock limit of every real environment call, C code included (the "
                        "episode's backend runs in a child process that is killed; 0: none): a "
                        "call past it ends its episode (docs/audit.md, limits)")
    p.add_argument("--call-memory-mb", type=limit_arg, default=DEFAULT_MEMORY_MB, metavar="MB",
                   help="memory a real environment call may add (0: no limit)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the model generates: auto (the GPU when there is one, as "
                        "`envace train` does), cpu or cuda")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # lazy: loads torch, transformers: kept out of --help
    from envace.evaluation.evaluate import check_eval_out, select_tasks  # imports torch
    from envace.evaluation.rehearsal_eval import evaluate_with_rehearsal
    from envace.model.rehearsal import RehearsalSettings

    try:
        device = _device(args.device)
        check_task_env(args.env)
        path = resolve_model(args.model, default_cache_dir(),
                             texts=_texts() if args.model == "tiny" else None)
        settings = RehearsalSettings(strategy=args.rehearsal, n=args.n if args.rehearsal != "none"
                                     else 0, max_new_tokens=args.max_new_tokens,
                                     max_context=args.max_context,
                                     max_memory_tokens=args.max_memory_tokens, seed=args.seed,
                                     world=args.world, lookup=_lookup(args),
                                     call_timeout_s=args.call_timeout or None,
                                     call_memory_mb=int(args.call_memory_mb) or None,
                                     trust=args.trust_above)
        if args.memory_k < 0 or (args.memory_k and args.rehearsal == "none"):
            raise ValueError("--memory-k K (K >= 1) is shown to rehearsed plans: --rehearsal "
                             "parallel or sequential")
        if args.memory_k:
            # lazy: loads pydantic, rapidfuzz: kept out of --help
            from audit.worlds.memory import ResponseMemory

            settings.memory = ResponseMemory.from_train_split(args.env)
            settings.memory_k = args.memory_k
    except ValueError as exc:
        print(f"envace eval: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    env = "" if args.env == "bfcl" else f"{args.env}-"
    world = "" if args.world == "self" else f"-{args.world}"
    world += "" if args.trust_above is None else f"-trust{args.trust_above:g}"
    out = Path(args.out or f"runs/eval-{env}{args.split}-{args.rehearsal}-n{settings.n}{world}")
    check_eval_out(out)  # before the model loads: another tool's folder is refused at once
    model, tok = load_model(path)
    model.to(device)
    tasks = select_tasks(args.split, args.unit, args.tasks, tok, args.max_context,
                         args.max_new_tokens, args.seed, env=args.env)
    s = evaluate_with_rehearsal(model, tok, tasks, settings, out, seeds=args.seeds,
                                reward=args.reward, model_name=str(path))
    ci = s["success_ci"]
    print(f"{args.split}: success {s['success_rate']:.1%} [{ci[0]:.1%}, {ci[1]:.1%}] over "
          f"{s['attempts']} attempts; rehearsal tokens/task {s['budget']['rehearsal_tokens']:.0f}"
          f" -> {out / RUN.eval_summary}")
    c = s["calls"]
    print(f"calls: {c['real_total']} real ({c['commit_real']} committed, {c['plans_real']} in "
          f"plans, {c['plans_gated_real']} of them sent by the trust gate), "
          f"{c['plans_rehearsed']} rehearsed; reward {s['reward_mean']:.3f}")
    return 0


def trust_arg(text: str) -> float:
    """``--trust-above``: a finite number <= 0 (``envace.model.trust.check_trust``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    # lazy: loads numpy (audit.stats): kept out of --help
    from envace.model.trust import check_trust

    try:
        return check_trust(value)  # type: ignore[return-value]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device(name: str) -> str:
    """`--device` resolved: auto is cuda when torch sees a GPU; cuda without one is refused."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no GPU here (use --device cpu or auto)")
    return "cuda" if name == "auto" and torch.cuda.is_available() else (
        "cpu" if name == "auto" else name)


def _lookup(args: argparse.Namespace) -> object | None:
    """The train split's lookup for ``--world hybrid``, its ranker for ``--world ranker``
    (refused without rehearsal)."""
    if args.world != "self" and args.rehearsal == "none":
        raise ValueError(f"--world {args.world} answers rehearsed plans: --rehearsal parallel "
                         "or sequential")
    if args.world == "ranker":
        # lazy: loads pydantic, rapidfuzz: kept out of --help
        from audit.worlds.ranker import Ranker

        return Ranker.from_train_split(args.env)
    if args.world != "hybrid":
        return None
    # lazy: loads pydantic, rapidfuzz: kept out of --help
    from audit.worlds.memory import ResponseMemory

    return ResponseMemory.from_train_split(args.env)


def _texts() -> list[str]:
    # lazy: loads pydantic, rapidfuzz, yaml: kept out of --help
    from envace.training.sft import load_train_trajectories, training_texts

    return training_texts(load_train_trajectories())
