"""A learned world model that ranks real responses: which copy is right, learnt from train calls.

    ranker = fit_ranker(ResponseMemory.from_file("train.jsonl"), "train.jsonl")
    answer = ranker.batch(tally)          # a TaskBatchAnswer: (requests, task ids) -> responses
    ranker(messages, tools, "cd", {"folder": "tmp"})   # or one call, as any WorldModel

What it is (issue #17). The audit's best reference, ``edit``, answers an identical training call
with its most common response and any other call with the most similar training call's response,
the call's differing argument values copied in. On BFCL's train split another candidate among
those a memory holds is right on about a fifth of the calls ``edit`` misses (leave-scenario-out:
66.9 % of calls have a right candidate among the ones below, ``edit`` is right on 57.3 %), and
whether a candidate fits often shows in the conversation: the values it holds were or were not
said before the call. This world model learns, from the train split alone, to pick among:

- the lookup's answer to the identical call (``ResponseMemory.exact``) and every other response
  that call got;
- the tool's most common response (``ResponseMemory.majority``);
- the responses of the ``k`` most similar training calls (``ResponseMemory.similar``) and the same
  responses with this call's differing argument values copied in
  (``audit.worlds.reference.substitute``; the first is ``edit``'s answer);

all from other scenarios than the asking task's (``audit.worlds.memory.scenario_key``), equal
candidates (after ``audit.scoring.canonical.canonical_text``) merged. Each candidate gets the
features of :func:`candidate_rows` (where it came from, how similar its source call is, how often
the tool or the identical call returned it, and how many of the values it holds occur in the
conversation so far); a gradient-boosted classifier (scikit-learn's
``HistGradientBoostingClassifier``, no early stopping, so the fit is deterministic) is fitted on
every answered real call of the train file, each call's candidates drawn from the *other* scenarios
(the same leave-scenario-out a held-out call sees), labelled right or wrong by exact equality with
the real response. It answers with the candidate of highest predicted probability (ties: the earlier
candidate, ``edit``'s first); a tool with no training call gets ``{}``.

It writes nothing new: every answer is a real training response or its copy-edit, so the audit's
novelty strata say where it wins, and skill against ``edit`` says whether picking from context
beats copying from the nearest call. Nothing is saved: the fit takes seconds and is rebuilt from
the train file each time (no pickle is ever loaded). Only train-split files are accepted
(``ResponseMemory.from_file``).

``envace probe --ranker TRAIN.jsonl dev.jsonl --reference TRAIN.jsonl --out DIR`` audits it.

Torch-free; imports scikit-learn and rapidfuzz.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz import fuzz

from audit.scoring.canonical import canonical_text
from audit.worlds.memory import Request, ResponseMemory, TaskBatchAnswer
from audit.worlds.reference import EMPTY, canonical_arguments, most_common_response, substitute
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.envs.task_envs import env_tasks
from envace.core.export import export_env, export_real
from envace.core.schema import read_trajectories

#: similar training calls whose responses (and copy-edits) are candidates
RANKER_K = 8
#: the classifier's settings, fixed by 5-fold leave-scenario-out cross-validation on the train
#: split (docs/results.md); no early stopping, so no random validation split
BOOSTING = {"max_iter": 200, "learning_rate": 0.05, "min_samples_leaf": 20,
            "early_stopping": False, "random_state": 0}
FEATURES = ("from_exact", "from_majority", "from_edit", "edited", "rank", "raw_rank",
            "similarity", "has_identical", "identical_share", "identical_calls", "tool_share",
            "tool_distinct", "seen_verbatim", "length", "arguments", "argument_values",
            "argument_values_in", "values", "values_in_history", "values_not_in_history",
            "history_share")
SOURCES = ("exact", "edit", "similar", "edited", "majority", "none")


def history_text(messages: Sequence[dict[str, Any]]) -> str:
    """The conversation so far as one text: every message's content and its calls' arguments."""
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        parts.append(content if isinstance(content, str) else json.dumps(content, default=str))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                args = fn.get("arguments")
                parts.append(args if isinstance(args, str)
                             else json.dumps(args, default=str, ensure_ascii=False))
    return " ".join(parts)


def response_values(text: str) -> list[str]:
    """The values a response states: a JSON response's leaf strings and numbers (not booleans or
    null), as text; any other response's words of three or more characters."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return [w for w in text.split() if len(w) > 2]
    out: list[str] = []
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, bool) or x is None:
            continue
        else:
            s = str(x)
            if s:
                out.append(s)
    return out


@dataclass
class _Candidate:
    text: str
    source: str
    f: dict[str, float] = field(default_factory=dict)


def candidate_rows(memory: ResponseMemory, tool: str, arguments: Any, task_id: str | None,
                   history: str, k: int = RANKER_K) -> list[tuple[str, str, str, list[float]]]:
    """(canonical text, response, source, features in `FEATURES` order) of every candidate for
    one call (module doc), ``edit``'s answer first; the source is the first of `SOURCES` that
    gave it. [] for a tool the memory has never seen. Pure."""
    query = canonical_arguments(arguments)
    identical = memory.identical_responses(tool, arguments, task_id)
    by_tool = memory.tool_responses(tool, task_id)
    if not by_tool:
        return []
    tool_counts = Counter(canonical_text(r) for r in by_tool)
    identical_counts = Counter(canonical_text(r) for r in identical)
    similar = memory.similar(tool, arguments, task_id, k)
    exact = most_common_response(identical) if identical else None  # memory.exact's answer
    args = arguments if isinstance(arguments, dict) else {}
    edit_answer = exact if exact is not None else (
        substitute(similar[0].response, similar[0].arguments, args) if similar and args
        else similar[0].response if similar else None)

    found: dict[str, _Candidate] = {}

    def add(text: str, source: str, **f: float) -> None:
        key = canonical_text(text)
        c = found.get(key)
        if c is None:
            c = found[key] = _Candidate(text, source, {
                "from_exact": 0, "from_majority": 0, "from_edit": 0, "edited": 0,
                "rank": 99, "raw_rank": 99, "similarity": 0})
        for name, value in f.items():
            c.f[name] = (min(c.f[name], value) if name in ("rank", "raw_rank")
                         else max(c.f[name], value))

    if edit_answer is not None:
        add(edit_answer, "edit", from_edit=1)
    if exact is not None:
        add(exact, "exact", from_exact=1)
    for r in identical:
        add(r, "exact")
    add(most_common_response(by_tool), "majority", from_majority=1)  # memory.majority's
    for rank, e in enumerate(similar):
        ratio = fuzz.ratio(query, e.key)
        add(e.response, "similar", raw_rank=rank, rank=rank, similarity=ratio)
        edited = substitute(e.response, e.arguments, args) if args else e.response
        if edited != e.response:
            add(edited, "edited", edited=1, rank=rank, similarity=ratio)

    values = [str(v) for v in args.values()
              if isinstance(v, (str, int, float)) and not isinstance(v, bool) and str(v)]
    rows: list[tuple[str, str, str, list[float]]] = []
    for key, c in found.items():
        held = response_values(c.text)
        inside = sum(1 for v in held if v in history)
        c.f.update({
            "has_identical": float(bool(identical)),
            "identical_share": identical_counts[key] / max(1, len(identical)),
            "identical_calls": len(identical),
            "tool_share": tool_counts[key] / len(by_tool),
            "tool_distinct": len(tool_counts) / len(by_tool),
            "seen_verbatim": float(tool_counts[key] > 0),
            "length": len(key),
            "arguments": len(args),
            "argument_values": len(values),
            "argument_values_in": sum(1 for v in values if v in c.text),
            "values": len(held),
            "values_in_history": inside,
            "values_not_in_history": len(held) - inside,
            "history_share": inside / max(1, len(held)),
        })
        rows.append((key, c.text, c.source, [float(c.f[name]) for name in FEATURES]))
    return rows


def training_calls(trajectories: Iterable[Any]) -> Iterable[tuple[str, str, dict[str, Any], str,
                                                                 str]]:
    """(task id, tool, arguments, history text, real response) of every answered, well-formed,
    real call: the history is the conversation up to the assistant message that makes the call,
    then the responses to that message's earlier calls, as the teacher-forced probe shows it
    (`audit.probe.probe_steps`)."""
    for traj in trajectories:
        dumped = [m.dump() for m in traj.messages]
        steps = traj.tool_steps()
        for st in steps:
            if st.arguments is None or st.response is None or st.response.rehearsed:
                continue
            earlier = [s.response.dump() for s in steps if s.message_index == st.message_index
                       and s.step < st.step and s.response is not None]
            history = history_text(dumped[:st.message_index + 1] + earlier)
            yield traj.task_id, st.tool, dict(st.arguments), history, st.response.content or ""


@dataclass
class Ranker:
    """A fitted ranker (module doc): a `WorldModel` and, with task ids, a `TaskBatchAnswer`."""

    memory: ResponseMemory
    model: Any
    k: int = RANKER_K
    fit_calls: int = 0
    fit_rows: int = 0
    fit_right: int = 0

    def choose(self, tool: str, arguments: Any, task_id: str | None,
               messages: Sequence[dict[str, Any]]) -> tuple[str, str]:
        """(answer, source) for one call."""
        history = history_text(messages)
        rows = candidate_rows(self.memory, tool, arguments, task_id, history, self.k)
        if not rows:
            return EMPTY, "none"
        probs = self.model.predict_proba([f for *_, f in rows])[:, 1]
        best = max(range(len(rows)), key=lambda i: (probs[i], -i))
        return rows[best][1], rows[best][2]

    @property
    def source(self) -> str | None:
        """The train file it was fitted on (what an evaluation's summary records)."""
        return self.memory.source

    def exact(self, tool: str, arguments: Any, task_id: str | None = None,
              messages: Sequence[dict[str, Any]] = ()) -> str | None:
        """The rollout's world hook (`envace eval --world ranker`): the pick for this call in
        this conversation; None where no other scenario than `task_id`'s ever called the tool
        (the policy answers). A rollout's system messages (the rehearsal memory of imagined
        plans, memory notes) are left out of the conversation it reads: it was fitted on real
        conversations, where a system message only names new tools. Earlier rehearsed
        responses stay in, as they stay in ``envace probe --history own``."""
        said = [m for m in messages if m.get("role") != "system"]
        text, source = self.choose(tool, arguments, task_id, said)
        return None if source == "none" else text

    @classmethod
    def from_train_split(cls, env: str) -> Ranker:
        """The ranker of environment `env`'s train split, exported from its tasks (what
        ``envace eval --world ranker`` uses)."""

        trajs = list(export_real(split_tasks("train")) if env == "bfcl"
                     else export_env(env, [t.id for t in env_tasks(env, "train")]))
        return fit_ranker(ResponseMemory.from_trajectories(trajs, f"the {env} train split"),
                          trajs)

    def __call__(self, messages: list[dict[str, Any]], tools: Any, tool: str,
                 arguments: dict[str, Any]) -> str:
        """As a plain `WorldModel`: no task id, so no scenario is left out of the candidates
        (right for dev and test tasks, whose scenarios train never holds; for a train task use
        `batch` or `exact` with its id)."""
        return self.choose(tool, arguments, None, messages)[0]

    def batch(self, tally: dict[str, int] | None = None) -> TaskBatchAnswer:
        """The ranker asked with task ids (`audit.probe.run_probe(task_ids=True)`); `tally`
        counts where each answer came from (`SOURCES`)."""

        def answer(requests: list[Request], task_ids: list[str]) -> list[Any]:
            out = []
            for (messages, _, tool, arguments), task in zip(requests, task_ids, strict=True):
                text, source = self.choose(tool, arguments, task, messages)
                if tally is not None:
                    tally[source] = tally.get(source, 0) + 1
                out.append(text)
            return out

        return answer

    def block(self, tally: dict[str, int]) -> dict[str, Any]:
        """The summary's `world_model.ranker` block."""
        return {"file": self.memory.source, "k": self.k, "calls": len(self.memory),
                "features": list(FEATURES), "boosting": dict(BOOSTING),
                "fit": {"calls": self.fit_calls, "candidates": self.fit_rows,
                        "right": self.fit_right},
                "chosen": {s: tally.get(s, 0) for s in SOURCES}}


def fit_ranker(memory: ResponseMemory, trajectories: str | os.PathLike[str] | Iterable[Any],
               k: int = RANKER_K) -> Ranker:
    """Fit the ranker on every answered real call of `trajectories` (a train-split file, or
    trajectories), each call's candidates from the other scenarios of `memory`. ValueError when
    no call has a right candidate (nothing to learn)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    trajs = ([item.trajectory for item in read_trajectories(trajectories)
              if item.trajectory is not None]
             if isinstance(trajectories, (str, os.PathLike)) else list(trajectories))
    x: list[list[float]] = []
    y: list[int] = []
    calls = 0
    for task, tool, args, history, real in training_calls(trajs):
        rows = candidate_rows(memory, tool, args, task, history, k)
        if not rows:
            continue
        calls += 1
        want = canonical_text(real)
        for key, _, _, f in rows:
            x.append(f)
            y.append(int(key == want))
    if not any(y) or all(y):
        raise ValueError(f"cannot fit a ranker: {sum(y)} of {len(y)} candidates of {calls} "
                         "calls are right (needs both right and wrong ones)")
    model = HistGradientBoostingClassifier(**BOOSTING).fit(x, y)
    return Ranker(memory, model, k, calls, len(y), sum(y))
