"""Benchmark: our GRPO trainer against trl's GRPOTrainer, same model, batch, lengths and reward.

    .venv/bin/python -m bench.trainer_vs_trl                      # 6 steps each, a few minutes
    .venv/bin/python -m bench.trainer_vs_trl --steps 2 --completion 16   # smoke

Single turn, one prompt -> one completion: per-turn train tasks (``envace.core.envs.bfcl.turns``)
with prompts
of at most ``--max-prompt`` tokens; step s uses prompts [sP, (s+1)P) on both sides (P
``--prompts``), group 4, temperature 1, top_p 1, at most ``--completion`` new tokens stopped by
``<|im_end|>``, reward = action F1 of the parsed calls against the ground truth
(``envace.core.rewards``), lr 1e-6 constant, AdamW wd 0.01, grad clip 1, token-mean loss over the
batch (trl ``loss_type=dapo``), advantages not scaled by the group std, no KL, no reference model,
float32 on CPU, micro-batches of ``--micro-batch``.

- ``ours``: ``envace.training.train.train_step``, ``mode=grpo`` (act-only), ``max_turns=1``: rollout
(our
  engine) -> verifier reward -> fidelity audit -> advantages -> ``envace.training.update.update``.
- ``trl``: ``GRPOTrainer`` without vLLM, ``use_cpu``, bf16 and gradient checkpointing off,
  ``beta=0``, ``num_generations=4``, ``generation_batch_size=4P`` (one generation per optimizer
  step), ``shuffle_dataset=False``, ``scale_rewards=none``; the same prompts as text (checked to
  re-tokenise to our prompt ids) and the same reward function.

Each side runs in its own subprocess (its own peak RSS, ``ru_maxrss``). Per side: whole steps per
minute (generation included) and update-only tokens/s (real prompt + completion tokens through
forward, loss and backward, and completion tokens alone; ours: ``seconds/update``; trl: step time
minus ``_generate_and_score_completions``, so its update includes its logging), as medians over
the steps after the first (warm-up). Default model: the untrained tiny preset, whose samples
almost never stop early, so both sides train on equal lengths (``--model PATH`` for another).
Writes bench/results/trainer_vs_trl.json (``quiet_machine``: 1-min load average < 1.5), a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench.machine import table, write_result


def rss_now() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def select_tasks(args: argparse.Namespace, tok: Any) -> list[Any]:
    """steps * prompts per-turn train tasks with short prompts, in a fixed seeded order."""
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.envs.bfcl.turns import turn_tasks
    from envace.model import chat

    tasks = turn_tasks(split_tasks("train"))
    random.Random(args.seed).shuffle(tasks)
    out = []
    for t in tasks:
        if len(prompt_ids(t, tok, chat)) <= args.max_prompt:
            out.append(t)
        if len(out) == args.steps * args.prompts:
            return out
    raise SystemExit(f"only {len(out)} tasks have prompts <= {args.max_prompt} tokens")


def prompt_ids(task: Any, tok: Any, chat: Any) -> list[int]:
    return chat.encode_with_roles(tok, task.opening_messages(), task.tools(turn=0),
                                  generation_prompt="assistant", desc_chars=60)[0]


def run_ours(args: argparse.Namespace, path: str, tasks: list[Any], tmp: Path) -> dict[str, Any]:
    from envace.training.config import TrainConfig
    from envace.training.train import train_step
    from envace.training.train_setup import build_policy

    cfg = TrainConfig(model=path, mode="grpo", task_unit="turn", reward="action", seed=args.seed,
                      prompts_per_step=args.prompts, group_size=4, temperature=1.0, top_p=1.0,
                      max_new_tokens=args.completion, max_turns=1, max_context_tokens=4096,
                      steps=args.steps, lr=1e-6, micro_batch_size=args.micro_batch,
                      checkpoint_every=0, output_dir=str(tmp), run_name="ours")
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    policy = build_policy(cfg, run_dir, None, progress=False)
    base = rss_now()
    steps = []
    for s in range(args.steps):
        chunk = tasks[s * args.prompts:(s + 1) * args.prompts]
        t = time.perf_counter()
        rec = train_step(s, policy, chunk, cfg, run_dir)
        whole = time.perf_counter() - t
        steps.append({"seconds": whole, "update_s": rec["seconds/update"],
                      "forward_tokens": rec["tokens/act"] + rec["tokens/context"],
                      "completion_tokens": rec["tokens/act"], "reward": rec["reward/mean"],
                      "rollout_s": rec["seconds/rollout"], "audit_s": rec["seconds/audit"]})
    return {"steps": steps, "rss_after_setup": base}


def run_trl(args: argparse.Namespace, path: str, tasks: list[Any], tmp: Path) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envace.core.rewards import task_reward
    from envace.model import chat
    from envace.model.models import load_model

    model, tok = load_model(path)
    by_id = {t.id: t for t in tasks}
    texts = []
    for t in tasks:
        ids = prompt_ids(t, tok, chat)
        text = tok.decode(ids, skip_special_tokens=False)
        assert tok(text=[text])["input_ids"][0] == ids, f"{t.id}: prompt re-tokenises differently"
        texts.append(text)
    data = Dataset.from_list([{"prompt": x, "task_id": t.id}
                              for x, t in zip(texts, tasks, strict=True)])
    seen: list[str] = []

    def action_f1(prompts: list, completions: list, task_id: list, **kw: Any) -> list[float]:
        seen.extend(task_id[::4])
        out = []
        for text, tid in zip(completions, task_id, strict=True):
            parsed = chat.parse_assistant(text.split(chat.IM_END, 1)[0])
            calls = [(c.name, c.arguments) for c in parsed.calls]
            out.append(task_reward("action", by_id[tid], [calls])["reward"])
        return out

    times: list[float] = []
    gen: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a: Any, **kw: Any) -> None:
            times.append(time.perf_counter())

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            times.append(time.perf_counter())

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            pm, cm = out["prompt_mask"], out["completion_mask"]
            gen.append({"seconds": time.perf_counter() - t, "completion_tokens": int(cm.sum()),
                        "forward_tokens": int(pm.sum() + cm.sum()),
                        "reward": float(out.get("rewards", cm.new_zeros(1)).float().mean())})
            return out

    mb = args.micro_batch
    cfg = GRPOConfig(
        output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, use_vllm=False, beta=0.0, num_iterations=1,
        num_generations=4, per_device_train_batch_size=mb,
        gradient_accumulation_steps=args.prompts * 4 // mb,
        generation_batch_size=args.prompts * 4, max_completion_length=args.completion,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-6, lr_scheduler_type="constant",
        weight_decay=0.01, max_grad_norm=1.0, loss_type="dapo", scale_rewards="none",
        epsilon=0.2, max_steps=args.steps, shuffle_dataset=False, logging_steps=1,
        save_strategy="no", report_to="none", seed=args.seed, disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False)
    trainer = Timed(model=model, reward_funcs=action_f1, args=cfg, train_dataset=data,
                    processing_class=tok, callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)  # no log dict printed per step
    base = rss_now()
    trainer.train()
    steps = []
    for s in range(args.steps):
        whole = times[s + 1] - times[s]
        steps.append({"seconds": whole, "update_s": whole - gen[s]["seconds"],
                      "generate_s": gen[s]["seconds"], **{k: v for k, v in gen[s].items()
                                                          if k != "seconds"}})
    expect = [t.id for t in tasks]
    return {"steps": steps, "rss_after_setup": base, "same_prompt_order": seen == expect}


def summary(res: dict[str, Any], skip: int) -> dict[str, Any]:
    """Medians over the measured steps (robust to a neighbour's burst of load), and totals."""
    steps = res["steps"][skip:] or res["steps"]
    secs, upd = sum(s["seconds"] for s in steps), sum(s["update_s"] for s in steps)
    fwd = sum(s["forward_tokens"] for s in steps)
    comp = sum(s["completion_tokens"] for s in steps)
    return {"measured_steps": len(steps),
            "steps_per_min": 60 / median(s["seconds"] for s in steps),
            "update_tokens_per_s": median(s["forward_tokens"] / s["update_s"] for s in steps),
            "update_completion_tokens_per_s": median(s["completion_tokens"] / s["update_s"]
                                                     for s in steps),
            "total_steps_per_min": 60 * len(steps) / secs, "total_update_tokens_per_s": fwd / upd,
            "update_share": upd / secs, "mean_completion_tokens": comp / len(steps),
            "mean_forward_tokens": fwd / len(steps),
            "mean_reward": sum(s["reward"] for s in steps) / len(steps)}


def ours_over_trl(sums: dict[str, dict[str, Any]], raw: dict[str, dict[str, Any]]
                  ) -> dict[str, float]:
    """The figures: each summary rate of ours over trl's, and the peak memory."""
    ratio = {k: sums["ours"][k] / sums["trl"][k] for k in
             ("steps_per_min", "update_tokens_per_s", "update_completion_tokens_per_s")}
    ratio["peak_rss"] = raw["ours"]["peak_rss"] / raw["trl"]["peak_rss"]
    return ratio


def child(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer
    from transformers.utils import logging

    from envace.model import chat
    from envace.model.models import default_cache_dir, resolve_model
    from envace.training.sft import load_train_trajectories, training_texts

    logging.set_verbosity_error()  # "sequence longer than the model" while measuring prompts
    path = args.model or str(resolve_model("tiny", default_cache_dir(),
                                           texts=training_texts(load_train_trajectories())))
    tok = AutoTokenizer.from_pretrained(path)
    tasks = select_tasks(args, tok)
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.side}-") as tmp:
        fn = run_ours if args.side == "ours" else run_trl
        res = fn(args, path, tasks, Path(tmp))
    lens = [len(prompt_ids(t, tok, chat)) for t in tasks]
    res.update(model=path, peak_rss=peak_rss(), mean_prompt_tokens=sum(lens) / len(lens))
    Path(args.out).write_text(json.dumps(res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per side (1st: warm-up)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (x4 completions)")
    ap.add_argument("--completion", type=int, default=64, help="max completion tokens")
    ap.add_argument("--max-prompt", type=int, default=640, help="max prompt tokens")
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward")
    ap.add_argument("--model", help="model folder (default: the untrained tiny preset)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="trainer_vs_trl",
                    help="result file bench/results/NAME.json (one per model)")
    ap.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        child(args)
        return 0
    load = os.getloadavg()[0]
    quiet = load < 1.5
    print(f"1-minute load average {load:.2f}: {'quiet' if quiet else 'BUSY (figures noisy)'}")
    raw: dict[str, Any] = {}
    for side in ("ours", "trl"):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "bench.trainer_vs_trl", *(argv or sys.argv[1:]),
                   "--side", side, "--out", f.name]
            t = time.perf_counter()
            subprocess.run(cmd, check=True)
            raw[side] = json.loads(Path(f.name).read_text())
            raw[side]["process_seconds"] = time.perf_counter() - t
    sums = {s: summary(raw[s], skip=1) for s in raw}
    rows = [[s, x["measured_steps"], x["steps_per_min"], x["update_tokens_per_s"],
             x["update_completion_tokens_per_s"], x["mean_forward_tokens"],
             x["mean_completion_tokens"], raw[s]["peak_rss"] / 2**20] for s, x in sums.items()]
    ratio = ours_over_trl(sums, raw)
    rows.append(["ours/trl", "", ratio["steps_per_min"], ratio["update_tokens_per_s"],
                 ratio["update_completion_tokens_per_s"], "", "", ratio["peak_rss"]])
    print(table(rows, ["trainer", "steps", "steps/min", "update tok/s", "update compl tok/s",
                       "fwd tok/step", "compl tok/step", "peak RSS MiB"]))
    path = write_result(args.name, {
        "quiet_machine": quiet, "load_avg_1min": load, "load_avg_1min_end": os.getloadavg()[0],
        "command": " ".join(["python -m bench.trainer_vs_trl", *(argv or sys.argv[1:])]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("side", "out")},
        "model": raw["ours"]["model"], "summary": sums, "ratio_ours_over_trl": ratio,
        "raw": raw})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
