"""Test-time rehearsal: rehearse candidate plans privately, then commit one real execution.

    results = rehearse_and_commit(model, tok, tasks, RehearsalSettings(strategy="parallel", n=2))

- ``parallel``: N plans are rehearsed independently (the policy acts and writes every tool
  response itself; no environment is touched), batched together so they share the work.
- ``sequential``: plan i sees plans 0..i-1 and a self-critique the policy wrote after each.
- Both: the plans form a *rehearsal memory* (format below) placed in the context of one real
  execution (mode ``real``), which commits. The real environment is touched by the commit only.

Memory format (a system message after the user's request)::

    Rehearsal memory (private plans imagined before acting; their responses may be wrong):
    Plan 1: cd(folder="document") -> {"current_working_directory": "document"}; ls() -> ...
    Critique 1: ...
    Use what helps, then act for real.

It is cut to ``max_memory_tokens``: the oldest plans are dropped first, and the memory says how
many were dropped. A plan that ended badly (malformed call, runaway message) still enters the
memory with its end reason, and the commit still happens.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

from envace import chat
from envace.envs.tasks import Task
from envace.rollout import ACT, REHEARSE, Episode, RolloutConfig, run_episodes

HEADER = "Rehearsal memory (private plans imagined before acting; their responses may be wrong):"
FOOTER = "Use what helps, then act for real."
CRITIQUE_ASK = "Before acting for real: in one or two sentences, what could go wrong with the plan?"


@dataclass
class RehearsalSettings:
    strategy: str = "parallel"  # none | parallel | sequential
    n: int = 2
    temperature: float = 0.8  # rehearsals explore
    commit_temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 128
    max_turns: int = 6
    max_context: int = 4096
    max_memory_tokens: int = 768
    response_chars: int = 160  # each imagined response is cut to this in the memory
    desc_chars: int = 60
    seed: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in ("none", "parallel", "sequential"):
            raise ValueError("strategy must be none, parallel or sequential")
        if self.n < 0 or (self.strategy != "none" and self.n < 1):
            raise ValueError("n must be >= 1 for a rehearsal strategy")


def plan_text(ep: Episode, index: int, response_chars: int) -> str:
    """One line per plan: its calls and the responses it imagined."""
    parts = []
    for st in ep.trajectory.tool_steps():
        args = json.dumps(st.arguments if st.arguments is not None else st.raw_arguments,
                          ensure_ascii=False)
        resp = st.response.content if st.response is not None else "(no response)"
        parts.append(f"{st.tool}({args}) -> {resp[:response_chars]}")
    body = "; ".join(parts) if parts else "(no tool call)"
    end = "" if ep.end_reason == "finished" else f" [ended: {ep.end_reason}]"
    return f"Plan {index}: {body}{end}"


def build_memory(plans: list[str], critiques: list[str], tokenizer: Any, budget: int
                 ) -> tuple[str, int]:
    """The memory text within ``budget`` tokens (oldest plans dropped first) and how many
    plans were dropped."""
    items = [p + (f"\nCritique {i + 1}: {critiques[i]}" if i < len(critiques) and critiques[i]
                  else "") for i, p in enumerate(plans)]
    dropped = 0
    while True:
        note = [f"({dropped} earlier plan(s) dropped to fit the context)"] if dropped else []
        text = "\n".join([HEADER, *note, *items[dropped:], FOOTER])
        ids = chat.encode_text(tokenizer, text)
        if len(ids) <= budget:
            return text, dropped
        if dropped >= len(items) - 1:  # even the newest plan alone is too long: cut it
            keep = budget - 1
            while keep > 0:  # decoding then encoding again may merge or split a token
                cut = tokenizer.decode(ids[:keep]) + "…"
                if len(chat.encode_text(tokenizer, cut)) <= budget:
                    return cut, dropped
                keep -= 1
            return "", dropped
        dropped += 1


def executed_calls(ep: Episode) -> int:
    """Calls the real environment executed for this episode (answered by it, after the task's
    history; a malformed call or an unknown tool is recorded but never executed)."""
    answered = sum(1 for st in ep.trajectory.tool_steps()
                   if st.response is not None and st.response.rehearsed is False)
    return answered - sum(len(m.get("tool_calls") or []) for m in ep.task.history)


def with_messages(task: Task, extra: list[dict[str, str]]) -> Task:
    """The task with messages appended after its (first) user turn."""
    turns = [list(task.turns[0]) + extra, *task.turns[1:]] if task.turns else [extra]
    return dataclasses.replace(task, turns=turns)


def _cfg(s: RehearsalSettings, mode: str, temperature: float, seed: int, **kw: Any
         ) -> RolloutConfig:
    return RolloutConfig(mode=mode, temperature=temperature, top_p=s.top_p,
                         max_new_tokens=kw.get("max_new_tokens", s.max_new_tokens),
                         max_turns=kw.get("max_turns", s.max_turns), max_context=s.max_context,
                         desc_chars=s.desc_chars, seed=seed)


def _critiques(model: Any, tok: Any, tasks: list[Task], plans: list[str],
               s: RehearsalSettings, seed: int) -> list[str]:
    asks = [with_messages(t, [{"role": "system", "content": f"{HEADER}\n{p}"},
                              {"role": "user", "content": CRITIQUE_ASK}])
            for t, p in zip(tasks, plans, strict=True)]
    eps = run_episodes(model, tok, asks, _cfg(s, "rehearse", s.temperature, seed,
                                               max_turns=1, max_new_tokens=64))
    out = []
    for e in eps:
        last = e.trajectory.messages[-1]
        out.append((last.content or "").strip()[:300] if last.role == "assistant" else "")
    return out


def rehearse_and_commit(model: Any, tok: Any, tasks: list[Task], s: RehearsalSettings
                        ) -> list[dict[str, Any]]:
    """For each task: its rehearsal episodes, memory, commit episode and budget."""
    t0 = time.perf_counter()
    plans: list[list[Episode]] = [[] for _ in tasks]
    critiques: list[list[str]] = [[] for _ in tasks]
    texts: list[list[str]] = [[] for _ in tasks]
    if s.strategy == "parallel":
        batch = [t for t in tasks for _ in range(s.n)]
        eps = run_episodes(model, tok, batch, _cfg(s, "rehearse", s.temperature, s.seed))
        for i, e in enumerate(eps):
            plans[i // s.n].append(e)
    elif s.strategy == "sequential":
        for k in range(s.n):
            asks = []
            for i, t in enumerate(tasks):
                mem = build_memory(texts[i], critiques[i], tok, s.max_memory_tokens)[0] \
                    if texts[i] else None
                asks.append(with_messages(t, [{"role": "system", "content": mem}]) if mem else t)
            eps = run_episodes(model, tok, asks, _cfg(s, "rehearse", s.temperature, s.seed + k))
            for i, e in enumerate(eps):
                plans[i].append(e)
                texts[i].append(plan_text(e, k + 1, s.response_chars))
            crit = _critiques(model, tok, tasks, [t[-1] for t in texts], s, s.seed + 100 + k)
            for i, c in enumerate(crit):
                critiques[i].append(c)
    t_rehearse = time.perf_counter() - t0
    commits_tasks, memories = [], []
    for i, t in enumerate(tasks):
        if s.strategy == "parallel":
            texts[i] = [plan_text(e, k + 1, s.response_chars) for k, e in enumerate(plans[i])]
        if texts[i]:
            mem, dropped = build_memory(texts[i], critiques[i], tok, s.max_memory_tokens)
            memories.append({"text": mem, "dropped": dropped})
            commits_tasks.append(with_messages(t, [{"role": "system", "content": mem}]))
        else:
            memories.append({"text": "", "dropped": 0})
            commits_tasks.append(t)
    commits = run_episodes(model, tok, commits_tasks,
                           _cfg(s, "real", s.commit_temperature, s.seed + 7919))
    t_total = time.perf_counter() - t0
    out = []
    for i, t in enumerate(tasks):
        reh_tokens = sum(e.tokens(ACT) + e.tokens(REHEARSE) for e in plans[i])
        real_calls = executed_calls(commits[i])
        out.append({
            "task": t, "plans": plans[i], "critiques": critiques[i], "memory": memories[i],
            "commit": commits[i],
            "budget": {"rehearsal_tokens": reh_tokens, "real_env_calls": real_calls,
                       "commit_tokens": commits[i].tokens(ACT),
                       "wall_s_share": t_total / len(tasks),
                       "rehearsal_wall_s_share": t_rehearse / len(tasks)},
        })
    return out
