"""Test-time rehearsal: rehearse candidate plans privately, then commit one real execution.

    results = rehearse_and_commit(model, tok, tasks, RehearsalSettings(strategy="parallel", n=2))

- ``parallel``: N plans are rehearsed independently (the policy acts and writes every tool
  response itself; no environment is touched), batched together so they share the work.
- ``sequential``: plan i sees plans 0..i-1 and a self-critique the policy wrote after each.
- Who answers a plan's calls (``world``): ``self``, the policy (the method: its own world
  model); ``hybrid``, the lookup's exact training answer where it has one and the policy
  elsewhere (``audit.worlds.memory``; the train split only, never the task's own scenario);
  ``ranker``, the learned ranker's pick among the train split's real responses and their copy-edits
  (``audit.worlds.ranker``; the policy only for a tool the train split never called); ``oracle``, a
  fresh private copy of the task's real environment per plan: an upper bound on what any world model
  could give the commit, not a method (the copies are discarded; the commit's environment is its
  own, and ``budget.sandbox_env_calls`` counts what the copies executed).
- ``trust`` (the confidence gate, ``envace.model.trust``; worlds where the policy writes
  responses): a plan's rehearsal whose mean token log-probability is below it is discarded and
  the call goes to a private real environment of that plan instead (``budget.gated_real_calls``;
  they count in ``sandbox_env_calls`` too: real calls the plans used).
- Both strategies: the plans form a *rehearsal memory* (format below) placed in the context of
  one real execution (mode ``real``), which commits. The task's real environment is touched by
  the commit only.

Memory format (a system message after the user's request)::

    Rehearsal memory (private plans imagined before acting; their responses may be wrong):
    Plan 1: cd({"folder": "document"}) -> {"current_working_directory": "document"}; ls({}) -> ...
    Critique 1: ...
    Use what helps, then act for real.

The memory holds only what the policy imagined: the calls it made while rehearsing and the
responses it wrote for them. The task's real history (earlier turns of a per-turn task, with real
responses) is not repeated there; it stays where it is, in the conversation.

It is cut to ``max_memory_tokens`` in this order: whole old plans (with their critiques) are
dropped first, oldest first, and the memory says how many; then the newest plan's critique; then
the newest plan's imagined responses are shortened (never its calls); only if its calls alone
exceed the budget is the text cut, with a note. A plan that ended badly (malformed call, runaway
message) still enters the memory with its end reason, and the commit still happens.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

from envace.core.envs.bfcl.tasks import Task
from envace.core.envs.limits import DEFAULT_CALL_TIMEOUT_S, DEFAULT_MEMORY_MB
from envace.model import chat
from envace.model.rollout import ACT, REHEARSE, Episode, RolloutConfig, run_episodes
from envace.model.trust import check_trust, gate_counts

WORLDS = ("self", "hybrid", "ranker", "oracle")
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
    # plans rehearsed with a memory of real responses (RolloutConfig.memory; train split only)
    memory: Any = None
    memory_k: int = 3
    # who answers the plans' calls (WORLDS): the policy itself; the hybrid (the lookup's exact
    # training answer where it has one, `lookup`, the policy elsewhere); the ranker
    # (`audit.worlds.ranker.Ranker` as `lookup`); or the oracle
    world: str = "self"
    # world="hybrid": `audit.worlds.memory.ResponseMemory` of the train split; world="ranker":
    # `audit.worlds.ranker.Ranker` fitted on it (anything with `exact(tool, args, task_id,
    # messages)`)
    lookup: Any = None
    # every real environment call's limits (RolloutConfig.call_timeout_s / call_memory_mb)
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S
    call_memory_mb: int | None = DEFAULT_MEMORY_MB
    # the confidence gate (envace.model.trust): a plan's rehearsal with mean token log-prob
    # below it is answered by a private real environment of the plan instead; None: off
    trust: float | None = None

    def __post_init__(self) -> None:
        self.trust = check_trust(self.trust)
        if self.trust is not None and (self.strategy == "none" or self.world == "oracle"):
            raise ValueError("the trust gate applies to rehearsed plans that the policy answers: "
                             "a rehearsal strategy (parallel or sequential) and world self, "
                             "hybrid or ranker")
        if self.strategy not in ("none", "parallel", "sequential"):
            raise ValueError("strategy must be none, parallel or sequential")
        if self.world not in WORLDS:
            raise ValueError(f"world={self.world!r}: one of {', '.join(WORLDS)}")
        if (self.world in ("hybrid", "ranker")) != (self.lookup is not None):
            raise ValueError(f"world={self.world!r}: only hybrid and ranker take a lookup (a "
                             "ResponseMemory of the train split, or a Ranker fitted on it), "
                             "and both need one")
        if self.n < 0 or (self.strategy != "none" and self.n < 1):
            raise ValueError("n must be >= 1 for a rehearsal strategy")

    @property
    def plan_mode(self) -> str:
        """The rollout mode of the plans: ``real`` for the oracle (each plan in its own fresh
        copy of the environment), else ``rehearse`` (the lookup answers in the hybrid)."""
        return "real" if self.world == "oracle" else "rehearse"


@dataclass(frozen=True)
class Plan:
    """One rehearsed plan as the memory shows it: its imagined calls and responses."""

    index: int
    calls: tuple[tuple[str, str], ...]  # (call text, the response the policy imagined)
    end: str = ""  # the end reason when the plan did not finish

    def render(self, response_chars: int | None = None, with_responses: bool = True) -> str:
        """``Plan i: call -> response; ...`` with each response cut to ``response_chars``."""
        parts = []
        for call, resp in self.calls:
            if not with_responses:
                parts.append(f"{call} -> …")
            elif response_chars is not None and len(resp) > response_chars:
                parts.append(f"{call} -> {resp[:response_chars]}…")
            else:
                parts.append(f"{call} -> {resp}")
        body = "; ".join(parts) if parts else "(no tool call)"
        end = f" [ended: {self.end}]" if self.end else ""
        return f"Plan {self.index}: {body}{end}"


def imagined_steps(ep: Episode) -> list[Any]:
    """The tool steps of a rehearsal episode that the policy made, after the task's history."""
    history = sum(len(m.get("tool_calls") or []) for m in ep.task.history)
    return ep.trajectory.tool_steps()[history:]


def imagined_messages(ep: Episode) -> list[Any]:
    """The messages of a rehearsal episode after the task's opening ones (its history)."""
    return ep.trajectory.messages[len(ep.task.opening_messages()):]


def plan_of(ep: Episode, index: int) -> Plan:
    """The plan of a rehearsal episode: only what the policy imagined."""
    calls = []
    for st in imagined_steps(ep):
        args = json.dumps(st.arguments if st.arguments is not None else st.raw_arguments,
                          ensure_ascii=False)
        resp = st.response.content if st.response is not None else "(no response)"
        calls.append((f"{st.tool}({args})", resp))
    return Plan(index, tuple(calls), "" if ep.end_reason == "finished" else ep.end_reason)


def plan_text(ep: Episode, index: int, response_chars: int) -> str:
    """One line per plan: its imagined calls and the responses it imagined."""
    return plan_of(ep, index).render(response_chars)


def _fits(text: str, tokenizer: Any, budget: int) -> bool:
    return len(chat.encode_text(tokenizer, text, measuring=True)) <= budget


def build_memory(plans: list[Plan] | list[str], critiques: list[str], tokenizer: Any,
                 budget: int, response_chars: int = 160) -> tuple[str, int]:
    """The memory text within ``budget`` tokens and how many (old) plans were dropped.

    Overflow, in order: drop whole old plans (with their critiques), oldest first; drop the
    newest plan's critique; shorten the newest plan's imagined responses, then leave them out
    (``-> …``, then nothing after the arrow; its calls stay); only if its calls alone do not
    fit, cut the text and say so."""

    def item(i: int, chars: int | None = response_chars, critique: bool = True,
             responses: bool = True) -> str:
        p = plans[i]
        body = p.render(chars, responses) if isinstance(p, Plan) else p
        c = critiques[i] if critique and i < len(critiques) else ""
        return body + (f"\nCritique {i + 1}: {c}" if c else "")

    def text(dropped: int, last: str | None = None) -> str:
        note = [f"({dropped} earlier plan(s) dropped to fit the context)"] if dropped else []
        items = [item(i) for i in range(dropped, len(plans))]
        if last is not None:
            items[-1] = last
        return "\n".join([HEADER, *note, *items, FOOTER])

    if not plans:
        return "", 0
    for dropped in range(len(plans)):
        t = text(dropped)
        if _fits(t, tokenizer, budget):
            return t, dropped
    dropped, newest = len(plans) - 1, len(plans) - 1
    t = text(dropped, item(newest, critique=False))
    if _fits(t, tokenizer, budget):
        return t, dropped
    if isinstance(plans[newest], Plan):
        chars = response_chars
        while chars > 8:  # shorter imagined responses, every call kept
            chars //= 2
            t = text(dropped, item(newest, chars, critique=False))
            if _fits(t, tokenizer, budget):
                return t, dropped
        t = text(dropped, item(newest, critique=False, responses=False))
        if _fits(t, tokenizer, budget):
            return t, dropped
        p = plans[newest]  # the calls with nothing after the arrow ("…" can cost tokens)
        t = text(dropped, Plan(p.index, tuple((c, "") for c, _ in p.calls), p.end).render())
        if _fits(t, tokenizer, budget):
            return t, dropped
    ids = chat.encode_text(tokenizer, t)  # the calls alone are too long: cut, and say so
    keep = budget - 8
    while keep > 0:  # decoding then encoding again may merge or split a token
        cut = tokenizer.decode(ids[:keep]) + "… (cut to fit the context)"
        if _fits(cut, tokenizer, budget):
            return cut, dropped
        keep -= 1
    return "", dropped


def executed_calls(ep: Episode) -> int:
    """Calls the real environment executed for this episode (answered by it, after the task's
    history; a malformed call or an unknown tool is recorded but never executed)."""
    return sum(1 for st in imagined_steps(ep)
               if st.response is not None and st.response.rehearsed is False)


def with_messages(task: Task, extra: list[dict[str, str]]) -> Task:
    """The task with messages appended after its (first) user turn."""
    turns = [list(task.turns[0]) + extra, *task.turns[1:]] if task.turns else [extra]
    return dataclasses.replace(task, turns=turns)


def _cfg(s: RehearsalSettings, mode: str, temperature: float, seed: int, **kw: Any
         ) -> RolloutConfig:
    return RolloutConfig(mode=mode, temperature=temperature, top_p=s.top_p,
                         max_new_tokens=kw.get("max_new_tokens", s.max_new_tokens),
                         max_turns=kw.get("max_turns", s.max_turns), max_context=s.max_context,
                         desc_chars=s.desc_chars, seed=seed,
                         memory=s.memory if mode == "rehearse" else None, memory_k=s.memory_k,
                         lookup=s.lookup if mode == "rehearse" else None,
                         rehearse_trust=s.trust if mode == "rehearse" else None,
                         call_timeout_s=s.call_timeout_s, call_memory_mb=s.call_memory_mb)


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
    texts: list[list[Plan]] = [[] for _ in tasks]
    if s.strategy == "parallel":
        batch = [t for t in tasks for _ in range(s.n)]
        eps = run_episodes(model, tok, batch, _cfg(s, s.plan_mode, s.temperature, s.seed))
        for i, e in enumerate(eps):
            plans[i // s.n].append(e)
    elif s.strategy == "sequential":
        for k in range(s.n):
            asks = []
            for i, t in enumerate(tasks):
                mem = build_memory(texts[i], critiques[i], tok, s.max_memory_tokens,
                                   s.response_chars)[0] if texts[i] else None
                asks.append(with_messages(t, [{"role": "system", "content": mem}]) if mem else t)
            eps = run_episodes(model, tok, asks, _cfg(s, s.plan_mode, s.temperature, s.seed + k))
            for i, e in enumerate(eps):
                plans[i].append(e)
                texts[i].append(plan_of(e, k + 1))
            crit = _critiques(model, tok, tasks, [t[-1].render(s.response_chars) for t in texts],
                              s, s.seed + 100 + k)
            for i, c in enumerate(crit):
                critiques[i].append(c)
    t_rehearse = time.perf_counter() - t0
    commits_tasks, memories = [], []
    for i, t in enumerate(tasks):
        if s.strategy == "parallel":
            texts[i] = [plan_of(e, k + 1) for k, e in enumerate(plans[i])]
        if texts[i]:
            mem, dropped = build_memory(texts[i], critiques[i], tok, s.max_memory_tokens,
                                        s.response_chars)
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
        sandbox_calls = sum(executed_calls(e) for e in plans[i])  # oracle plans, gated calls
        gated = [gate_counts(imagined_messages(e)) for e in plans[i]]
        out.append({
            "task": t, "plans": plans[i], "critiques": critiques[i], "memory": memories[i],
            "commit": commits[i],
            "budget": {"rehearsal_tokens": reh_tokens, "real_env_calls": real_calls,
                       "sandbox_env_calls": sandbox_calls,
                       "rehearsed_calls": sum(g["rehearsed"] for g in gated),
                       "gated_real_calls": sum(g["gated_real"] for g in gated),
                       "commit_tokens": commits[i].tokens(ACT),
                       "wall_s_share": t_total / len(tasks),
                       "rehearsal_wall_s_share": t_rehearse / len(tasks)},
        })
    return out
