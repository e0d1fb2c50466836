"""Measurement: what a small model's context holds of a τ² prompt, and what is cut, per domain.

    .venv/bin/python -m experiments.tau2_context [--domains airline retail telecom]

Exports each domain's dev split (``envace data export-real --env tau2 --split dev --domain D``)
and, for every dev tool call, builds the prompt a world model is given for it, as ``envace probe``
does (teacher-forced: the real messages before the call's response, cut by
``envace.model.windows.prompt_ids`` to the model's prompt budget, generation header ``tool``).
For each tokenizer (the tiny preset's, ``data/models/tiny-sft``; SmolLM2-135M-Instruct's) it
counts the uncut prompt's tokens (system prompt, tool listing, user turn, the history before the
call) against the model's positions, and for each prompt budget it reports how much of the
system turn is kept (``prompt_ids`` keeps its first half of the budget), whether any of the tool
listing survives, which of the policy's Markdown headings lie inside the kept part, and how many
of the history's messages are kept. Budgets: the probe's context minus its 256 new tokens
(``model_probe.context_length``: the SFT ``seq_len`` of a fine-tuned folder, else 2,048 capped by
the model's positions) and SmolLM2's whole 8,192 positions. No model is run; only tokenizers.
Writes bench/results/tau2_context.json with the command, the machine and the load.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 256  # envace probe --max-new-tokens default
#: tokenizer -> {budget label: prompt budget in tokens}
BUDGETS = {
    "tiny": {"tiny-sft probe (seq_len 2048)": 2048 - NEW_TOKENS,
             "tiny positions (4096)": 4096 - NEW_TOKENS},
    "smollm2": {"SmolLM2 zero-shot probe (2048)": 2048 - NEW_TOKENS,
                "SmolLM2 SFT probe (seq_len 1024)": 1024 - NEW_TOKENS,
                "SmolLM2 positions (8192)": 8192 - NEW_TOKENS},
}
POSITIONS = {"tiny": 4096, "smollm2": 8192}


def tokenizer(name: str) -> Any:
    from envace.model.models import default_cache_dir, load_model, resolve_model

    path = ROOT / "data/models/tiny-sft" if name == "tiny" else resolve_model(
        "smollm2", default_cache_dir())
    return load_model(path)[1]


def headings(text: str) -> list[tuple[int, str]]:
    """(character offset, title) of every Markdown heading of the system prompt."""
    return [(m.start(), m.group(1).strip()) for m in re.finditer(r"(?m)^#+\s*(.+)$", text)]


def step_prompts(traj: Any) -> list[list[dict[str, Any]]]:
    """The messages a teacher-forced probe shows before each call's response."""
    msgs = [m.dump() for m in traj.messages]
    out = []
    for i, m in enumerate(msgs):
        if m.get("role") == "tool":
            out.append(msgs[:i])
    return out


def measure(tok: Any, trajs: list[Any], budgets: dict[str, int], positions: int
            ) -> dict[str, Any]:
    from envace.model.windows import message_blocks, prompt_ids

    system = next(m.content for m in trajs[0].messages if m.role == "system")
    policy_ids = tok(system, add_special_tokens=False)["input_ids"]
    heads = headings(system)
    rows = []
    for traj in trajs:
        for msgs in step_prompts(traj):
            blocks, kinds = message_blocks(tok, msgs, traj.tools, "tool")
            total = sum(len(b[0]) for b in blocks)
            row = {"total": total, "system_turn": len(blocks[0][0]),
                   "user": len(blocks[1][0]) if len(blocks) > 1 else 0,
                   "history_messages": len(blocks) - 3, "cut": {}}
            for label, budget in budgets.items():
                ids = prompt_ids(tok, msgs, traj.tools, "tool", budget)
                sys_kept = min(len(blocks[0][0]), (budget - len(blocks[-1][0])) // 2)
                # what follows the kept system part: the latest history messages that fit (the
                # user turn, carried or not, is not history)
                rest = len(ids) - sys_kept - len(blocks[-1][0])
                kept, used = 0, 0
                for b in reversed(blocks[2:-1]):
                    if used + len(b[0]) > rest:
                        break
                    used += len(b[0])
                    kept += 1
                row["cut"][label] = {"system_kept": sys_kept, "messages_kept": kept,
                                     "whole": len(ids) == total, "fits": total <= budget}
            rows.append(row)
    sys_turn = rows[0]["system_turn"]
    out: dict[str, Any] = {
        "calls": len(rows),
        "system_prompt_chars": len(system),
        "system_prompt_tokens": len(policy_ids),
        "system_turn_tokens": sys_turn,
        "tool_listing_tokens": sys_turn - len(policy_ids),
        "tools": len(trajs[0].tools or []),
        "user_turn_tokens_median": statistics.median(r["user"] for r in rows),
        "prompt_tokens_median": statistics.median(r["total"] for r in rows),
        "prompt_tokens_max": max(r["total"] for r in rows),
        "calls_over_positions": sum(r["total"] > positions - NEW_TOKENS for r in rows),
        "positions": positions,
        "budgets": {},
    }
    for label, budget in budgets.items():
        kept = rows[0]["cut"][label]["system_kept"]
        kept_chars = len(tok.decode(policy_ids[:kept])) if kept < len(policy_ids) else len(system)
        cuts = [r["cut"][label] for r in rows]
        hist = [r for r in rows if r["history_messages"] > 0]
        out["budgets"][label] = {
            "budget_tokens": budget,
            "system_tokens_kept": kept,
            "system_prompt_chars_kept": kept_chars,
            "system_prompt_share_kept": round(kept_chars / len(system), 3),
            "tool_listing_kept": kept > len(policy_ids),
            "headings_kept": [h for o, h in heads if o < kept_chars],
            "headings_cut": [h for o, h in heads if o >= kept_chars],
            # prompt_ids keeps at most half the budget of the system turn, so a prompt that
            # would fit whole is cut all the same where its system turn is longer than that
            "calls_prompt_would_fit": sum(c["fits"] for c in cuts),
            "calls_whole_prompt": sum(c["whole"] for c in cuts),
            "history_messages_median": statistics.median(r["history_messages"] for r in hist),
            "history_messages_kept_median": statistics.median(
                r["cut"][label]["messages_kept"] for r in hist),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    ap.add_argument("--call-timeout", default="120",
                    help="--call-timeout of every export and probe (default 120 s, not the "
                    "CLI's 30: at a load of 50 on 2 cores tau2's first reset took longer)")
    args = ap.parse_args(argv)
    from bench.machine import run_record, write_result
    from envace.core.schema import read_trajectories

    load_start = os.getloadavg()
    toks = {name: tokenizer(name) for name in BUDGETS}
    out: dict[str, Any] = {}
    commands: list[str] = []
    for d in args.domains:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = ["envace", "data", "export-real", "--env", "tau2", "--domain", d,
                   "--split", "dev", "--out", "dev.jsonl", "--call-timeout", args.call_timeout]
            print("$", " ".join(cmd), flush=True)
            subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=tmp, check=True)
            commands.append(" ".join(cmd))
            trajs = [i.trajectory for i in read_trajectories(Path(tmp) / "dev.jsonl")
                     if i.trajectory is not None]
        out[d] = {name: measure(tok, trajs, BUDGETS[name], POSITIONS[name])
                  for name, tok in toks.items()}
        print(d, {n: (v["prompt_tokens_median"], v["system_turn_tokens"])
                  for n, v in out[d].items()}, flush=True)
    path = write_result("tau2_context", {
        "env": "tau2", "split": "dev", "commands": commands, "dev": out,
        **run_record("experiments.tau2_context", argv, load_start),
        "note": "prompts as envace probe builds them (teacher-forced, prompt_ids), counted with "
                "each model's tokenizer; a budget is the context minus 256 new tokens"})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
