"""A memory of real responses: similar training calls and what the real environment returned.

    memory = ResponseMemory.from_file("train.jsonl")    # envace data export-real --split train
    memory.similar("cd", {"folder": "docs"}, task_id="multi_turn_base_7", k=3)   # entries
    note = render_note(memory.similar(...))             # the block the world model is shown
    memory.exact("cd", {"folder": "docs"}, task_id)     # the lookup's exact answer, or None

Three world models of issue #17 are built on it, each scored by the audit like any other:

- **with a memory** (``envace probe --memory train.jsonl [--memory-k 3]``): before the open tool
  header of every request, the model is shown a note, one system message appended to the
  conversation (:func:`with_note`), listing the k most similar training calls of the same tool
  and the real response each got (:func:`render_note`);
- **trained with a memory** (``envace sft --memory-k K``): every training response preceded by
  its call's note (:func:`with_notes_before_responses`), so the model learns to use it;
- **the hybrid** (``envace probe --hybrid train.jsonl``): the lookup's exact answer where the
  lookup has one for this (tool, arguments), the model elsewhere (:func:`hybrid_batch`).

Where the memory comes from. Only from a file of real trajectories of the **train** split
(``envace data export-real --split train``): :meth:`ResponseMemory.from_file` refuses a file
holding any trajectory whose task is not a train-split task of its environment (BFCL,
``data/splits/train.txt``; AgentDojo, ``data/splits/agentdojo/train.txt``; τ²,
``data/splits/tau2/train.txt``), so dev and test
responses can never be shown. The calls kept are those the audit's reference world models are
built from (``audit.pipeline.reference_triples``: answered, well-formed, not rehearsed).

Never from the task's own scenario. Every entry carries its task's scenario
(:func:`scenario_key`): BFCL tasks ``multi_turn_<category>_<n>`` share scenario ``n`` across
their four categories (a per-turn task ``<id>@t<k>`` is its base task's); an AgentDojo task
``<suite>/user_task_<n>`` is its own scenario. Retrieval and the exact answer skip every entry
of the asking task's scenario (on dev and test tasks there is none: splits are by scenario).

Retrieval (:meth:`ResponseMemory.similar`): among distinct (arguments, response) pairs of the
same tool, ranked by ``rapidfuzz.fuzz.ratio`` (normalised Indel similarity, 0-100) between the
canonical JSON of the arguments (``audit.worlds.reference.canonical_arguments``), ties by first
appearance in the file; an identical call scores 100 and so ranks first. rapidfuzz rather than a
scikit-learn vectorizer: arguments are short JSON values (paths, names, ids) where near-identical
calls differ by a few characters, which an edit similarity sees and a bag of tokens does not;
it needs no fitting or vocabulary, so a query's ranking depends on nothing but the two strings,
and it is deterministic. A tool never seen in training gets no note.

The note (:func:`render_note`; deterministic: the same entries give the same text)::

    Similar calls and what the real environment returned:
    call: cd({"folder":"docs"})
    returned: {"current_working_directory": "docs"}
    call: ...

Arguments are cut to ``ARG_CHARS`` and responses to ``RESPONSE_CHARS`` characters (``...``
marks a cut); entries are added while the note stays within ``max_chars`` (``NOTE_CHARS`` by
default; :func:`note_chars` gives the local probe's budget for a prompt budget in tokens, at
most one character per token of it, so the note never takes more than about a third of the
prompt at BFCL's three-plus characters per token). The prompt is then cut as usual, keeping the
latest messages, so the note, last before the open header, is always kept.

Torch-free; imports rapidfuzz.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rapidfuzz import fuzz

from audit.scoring.canonical import canonical_text
from audit.worlds.reference import canonical_arguments, most_common_response
from envace.core.envs.units import scenario_of
from envace.core.errors import UsageError
from envace.core.schema import read_trajectories
from envace.core.worldmodel import Unanswered

DEFAULT_K = 3
ARG_CHARS = 200
RESPONSE_CHARS = 300
NOTE_CHARS = 1200
NOTE_TITLE = "Similar calls and what the real environment returned:"

#: (messages, tools, tool, arguments): one request of the probe (`audit.probe.Request`)
Request = tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str, dict[str, Any]]
#: a batch world model: requests -> answers in order (`audit.probe.BatchAnswer`)
BatchAnswer = Callable[[list[Request]], list["str | Unanswered"]]
#: a batch world model that is also told each request's task id (`run_probe(task_ids=True)`)
TaskBatchAnswer = Callable[[list[Request], list[str]], list["str | Unanswered"]]


def scenario_key(task_id: str) -> str:
    """The scenario a task belongs to: ``bfcl:<n>`` for BFCL ``multi_turn_<category>_<n>``
    (its four categories share it; ``@t<k>`` per-turn suffixes are dropped), else the task id
    itself (an AgentDojo ``<suite>/user_task_<n>`` is its own scenario)."""
    return scenario_of(str(task_id).split("@t", 1)[0])  # the resampling unit's own rule


@dataclass(frozen=True)
class Entry:
    """One real call of the training file: the call, its real response, whose task it was."""

    tool: str
    arguments: dict[str, Any]
    response: str
    task_id: str

    @property
    def key(self) -> str:
        """The canonical arguments (the lookup's key)."""
        return canonical_arguments(self.arguments)


def _train_ids(env: str) -> set[str] | None:
    """The train split's task ids of environment `env`; None when it has no committed splits."""
    if env == "bfcl":
        from envace.core.envs.bfcl.tasks import split_ids

        return set(split_ids("train"))
    if env == "agentdojo":
        from envace.core.envs.agentdojo.tasks import split_ids as agentdojo_ids

        return set(agentdojo_ids("train"))
    if env == "tau2":
        from envace.core.envs.tau2.tasks import split_ids as tau2_ids

        return set(tau2_ids("train"))
    return None


def split_violations(tasks: Sequence[tuple[str, str]]) -> list[str]:
    """Which of the `(environment, task id)` pairs are not train-split tasks, one line each."""
    bad: list[str] = []
    known: dict[str, set[str] | None] = {}
    for env, task in tasks:
        if env not in known:
            known[env] = _train_ids(env)
        ids = known[env]
        base = str(task).split("@t", 1)[0]
        if ids is None:
            bad.append(f"{task} ({env} has no committed splits)")
        elif base not in ids:
            bad.append(f"{task} (not in the {env} train split)")
    return bad


def train_tasks_in(paths: Iterable[str | os.PathLike[str]]) -> int:
    """How many readable trajectories of `paths` are train-split tasks of their environment."""
    tasks = [(str(i.trajectory.env.get("name")), i.trajectory.task_id)
             for p in paths for i in read_trajectories(p) if i.trajectory is not None]
    return len(tasks) - len(split_violations(tasks))


def _entries(traj: Any) -> list[Entry]:
    """The answered, well-formed, real calls of one trajectory."""
    return [Entry(st.tool, dict(st.arguments), st.response.content or "", traj.task_id)
            for st in traj.tool_steps()
            if st.arguments is not None and st.response is not None
            and not st.response.rehearsed]


class ResponseMemory:
    """Real training calls, retrievable by similarity and by identity (see the module doc)."""

    def __init__(self, entries: Sequence[Entry], source: str | None = None) -> None:
        self.entries = list(entries)
        self.source = source
        # tool -> distinct (key, canonical response) pairs in first-seen order, each with the
        # raw entry first seen and every scenario it occurs in
        self._pairs: dict[str, dict[tuple[str, str], tuple[Entry, set[str]]]] = defaultdict(dict)
        self._calls: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
        self._tools: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for e in self.entries:
            scen = scenario_key(e.task_id)
            pair = (e.key, canonical_text(e.response))
            first, scenarios = self._pairs[e.tool].setdefault(pair, (e, set()))
            scenarios.add(scen)
            self._calls[(e.tool, e.key)].append((scen, e.response))
            self._tools[e.tool].append((scen, e.response))

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def from_trajectories(cls, trajectories: Iterable[Any], source: str) -> ResponseMemory:
        """The memory of real trajectories (`envace.core.export.export_real` of the train split:
        what `from_file` reads); the same split check, `UsageError` when one is refused."""
        entries: list[Entry] = []
        tasks: list[tuple[str, str]] = []
        for traj in trajectories:
            tasks.append((str(traj.env.get("name")), traj.task_id))
            entries += _entries(traj)
        bad = split_violations(tasks)
        if bad:
            raise UsageError(f"{source}: {len(bad)} of {len(tasks)} trajectories are not "
                             f"train-split tasks (first: {bad[0]})")
        if not entries:
            raise UsageError(f"{source} holds no answered real call")
        return cls(entries, source)

    @classmethod
    def from_train_split(cls, env: str) -> ResponseMemory:
        """The memory of environment `env`'s train split, exported from its tasks (what
        `memory_k` of `envace train` and `--memory-k` of `envace rollout/eval` show)."""
        from envace.core.envs.bfcl.tasks import split_tasks
        from envace.core.envs.task_envs import env_tasks
        from envace.core.export import export_env, export_real

        trajs = (export_real(split_tasks("train")) if env == "bfcl"
                 else export_env(env, [t.id for t in env_tasks(env, "train")]))
        return cls.from_trajectories(trajs, f"the {env} train split")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ResponseMemory:
        """The memory of a train-split real trajectory file; `UsageError` (one line) when a
        trajectory's task is not a train-split task, or when nothing in it is usable."""
        entries: list[Entry] = []
        tasks: list[tuple[str, str]] = []
        try:
            for item in read_trajectories(path):
                traj = item.trajectory
                if traj is None:
                    continue
                tasks.append((str(traj.env.get("name")), traj.task_id))
                entries += _entries(traj)
        except OSError as exc:
            raise UsageError(f"cannot read memory file {path}: {exc.strerror or exc}") from None
        bad = split_violations(tasks)
        if bad:
            raise UsageError(
                f"memory file {path}: {len(bad)} of {len(tasks)} trajectories are not train-split "
                f"tasks (first: {bad[0]}); a memory of real responses is built only from the "
                "train split: envace data export-real --split train --out train.jsonl")
        if not entries:
            raise UsageError(f"memory file {path} holds no answered real call")
        return cls(entries, str(path))

    def similar(self, tool: str, arguments: Any, task_id: str | None = None,
                k: int = DEFAULT_K) -> list[Entry]:
        """At most `k` distinct (arguments, response) pairs of `tool` from other scenarios than
        `task_id`'s, most similar arguments first (ties: first seen); an identical call first."""
        if k <= 0:
            return []
        own = None if task_id is None else scenario_key(task_id)
        query = canonical_arguments(arguments)
        scored = []
        for index, ((key, _), (entry, scenarios)) in enumerate(self._pairs.get(tool, {}).items()):
            if own is not None and scenarios <= {own}:
                continue
            scored.append((-fuzz.ratio(query, key), index, entry))
        scored.sort(key=lambda s: (s[0], s[1]))
        return [entry for _, _, entry in scored[:k]]

    def exact(self, tool: str, arguments: Any, task_id: str | None = None,
              messages: Sequence[dict[str, Any]] = ()) -> str | None:
        """The lookup's answer to the identical call (`audit.worlds.reference` ``lookup``: the most
        common response, ties to the first seen), from other scenarios than `task_id`'s; None
        when no other scenario made this call. `messages` (the conversation so far) is ignored:
        the lookup keys on the call alone (a rollout asks every world it is given the same
        way: `audit.worlds.ranker.Ranker.exact` reads them)."""
        seen = self.identical_responses(tool, arguments, task_id)
        return most_common_response(seen) if seen else None

    def identical_responses(self, tool: str, arguments: Any,
                            task_id: str | None = None) -> list[str]:
        """Every response the identical call got, in file order, from other scenarios than
        `task_id`'s ([] when no other scenario made it)."""
        own = None if task_id is None else scenario_key(task_id)
        return [r for scen, r in self._calls.get((tool, canonical_arguments(arguments)), ())
                if scen != own]

    def tool_responses(self, tool: str, task_id: str | None = None) -> list[str]:
        """Every response of `tool`, in file order, from other scenarios than `task_id`'s."""
        own = None if task_id is None else scenario_key(task_id)
        return [r for scen, r in self._tools.get(tool, ()) if scen != own]

    def majority(self, tool: str, task_id: str | None = None) -> str | None:
        """The tool's most common training response (`audit.worlds.reference` ``majority``, the
        lookup's fallback), from other scenarios than `task_id`'s; None for an unseen tool."""
        seen = self.tool_responses(tool, task_id)
        return most_common_response(seen) if seen else None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def render_note(entries: Sequence[Entry], max_chars: int = NOTE_CHARS) -> str:
    """The note shown to the world model (module doc); "" when no entry fits or none is given."""
    lines: list[str] = []
    size = len(NOTE_TITLE)
    for e in entries:
        item = (f"call: {e.tool}({_cut(e.key, ARG_CHARS)})\n"
                f"returned: {_cut(e.response, RESPONSE_CHARS)}")
        if size + 1 + len(item) > max_chars:
            break
        lines.append(item)
        size += 1 + len(item)
    return "\n".join([NOTE_TITLE, *lines]) if lines else ""


def note_chars(budget_tokens: int) -> int:
    """The note's character budget for a prompt budget of `budget_tokens` tokens."""
    return max(0, min(NOTE_CHARS, int(budget_tokens)))


def with_note(messages: list[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    """The conversation with the note as a last system message (unchanged when `note` is "")."""
    return [*messages, {"role": "system", "content": note}] if note else list(messages)


def with_notes_before_responses(messages: Sequence[dict[str, Any]], steps: Sequence[Any],
                                memory: ResponseMemory, task_id: str, k: int = DEFAULT_K,
                                max_chars: int = NOTE_CHARS) -> list[dict[str, Any]]:
    """A whole conversation (`messages`, a trajectory's messages as dicts) with, before every
    tool response, the note of its call's `k` most similar training calls (never from
    `task_id`'s scenario), as a system message marked ``memory: true``: what ``envace sft
    --memory-k`` trains on. `steps` is the trajectory's `tool_steps()` (its calls, paired with
    their responses by id, arguments parsed); a response gets its call's note, none when the
    call's arguments are malformed or the memory has no entry of its tool. The input is not
    changed."""
    notes = {st.call_id: render_note(memory.similar(st.tool, st.arguments, task_id, k), max_chars)
             for st in steps if st.arguments is not None}
    out: list[dict[str, Any]] = []
    for m in messages:
        note = notes.pop(m.get("tool_call_id"), "") if m.get("role") == "tool" else ""
        if note:
            out.append({"role": "system", "content": note, "memory": True})
        out.append(dict(m))
    return out


def noted_requests(requests: list[Request], task_ids: list[str], memory: ResponseMemory,
                   k: int = DEFAULT_K, max_chars: int = NOTE_CHARS) -> list[Request]:
    """The requests with each conversation gaining the note of its call's `k` most similar
    training calls (never from the request's own scenario)."""
    shown = []
    for (messages, tools, tool, arguments), task in zip(requests, task_ids, strict=True):
        note = render_note(memory.similar(tool, arguments, task, k), max_chars)
        shown.append((with_note(messages, note), tools, tool, arguments))
    return shown


def memory_batch(inner: BatchAnswer, memory: ResponseMemory, k: int = DEFAULT_K,
                 max_chars: int = NOTE_CHARS) -> TaskBatchAnswer:
    """`inner` shown the memory (:func:`noted_requests`)."""
    return lambda requests, task_ids: inner(noted_requests(requests, task_ids, memory, k,
                                                           max_chars))


def task_blind(inner: BatchAnswer) -> TaskBatchAnswer:
    """A batch world model that ignores the task ids it is given."""
    return lambda requests, task_ids: inner(requests)


def hybrid_batch(inner: TaskBatchAnswer, memory: ResponseMemory,
                 tally: dict[str, int] | None = None) -> TaskBatchAnswer:
    """The lookup's exact answer where it has one for the call (`ResponseMemory.exact`), else
    `inner`'s (asked only for those requests). `tally` counts ``lookup`` and ``model``
    answers."""

    def answer(requests: list[Request], task_ids: list[str]) -> list[str | Unanswered]:
        out: list[str | Unanswered | None] = [memory.exact(r[2], r[3], t)
                                               for r, t in zip(requests, task_ids, strict=True)]
        ask = [i for i, a in enumerate(out) if a is None]
        if ask:
            got = inner([requests[i] for i in ask], [task_ids[i] for i in ask])
            if len(got) != len(ask):
                raise ValueError(f"world model gave {len(got)} answers for {len(ask)} requests")
            for i, a in zip(ask, got, strict=True):
                out[i] = a
        if tally is not None:
            tally["lookup"] = tally.get("lookup", 0) + len(requests) - len(ask)
            tally["model"] = tally.get("model", 0) + len(ask)
        return out  # type: ignore[return-value]

    return answer


@dataclass(frozen=True)
class MemoryOptions:
    """How a base world model is grounded: shown a `memory` (k entries per call, notes of at
    most `max_chars`), choosing among its answer and `choose`'s real responses by `scorer`
    (`audit.worlds.choice`; k similar calls, and their edits with `choose_edits`), and/or wrapped in
    the `hybrid` with a lookup of `hybrid`'s calls."""

    memory: ResponseMemory | None = None
    k: int = DEFAULT_K
    hybrid: ResponseMemory | None = None
    max_chars: int = NOTE_CHARS
    choose: ResponseMemory | None = None
    scorer: Any = None
    choose_own: bool = True
    choose_edits: bool = False

    @property
    def active(self) -> bool:
        """Whether anything wraps the base world model."""
        return any(m is not None for m in (self.memory, self.hybrid, self.choose))

    def label(self, base: str) -> str:
        """The summary's `audited_model`: ``BASE+memory(k=K)``, ``BASE+choice(k=K)``,
        ``hybrid(lookup,BASE)``, or combined:
        ``hybrid(lookup,BASE+memory(k=K)+choice(k=K))``."""
        name = f"{base}+memory(k={self.k})" if self.memory is not None else base
        among = ("" if self.choose_own else ",memory-only") + (",edits" if self.choose_edits
                                                               else "")
        name = f"{name}+choice(k={self.k}{among})" if self.choose is not None else name
        return f"hybrid(lookup,{name})" if self.hybrid is not None else name

    def wrap(self, base: BatchAnswer) -> tuple[TaskBatchAnswer, Callable[[], dict[str, Any]]]:
        """The grounded batch world model (asked with task ids: `run_probe(task_ids=True)`) and
        the summary's `world_model` block, asked once the probe is done. ValueError when
        `choose` is given without a `scorer`."""
        from audit.worlds.choice import SOURCES, choice_batch

        memory = self.memory
        chosen: dict[str, int] = dict.fromkeys(SOURCES, 0)
        if self.choose is not None:
            if self.scorer is None:
                raise ValueError("a choosing world model needs a scorer (a local model)")
            show = (None if memory is None else
                    lambda reqs, tids: noted_requests(reqs, tids, memory, self.k, self.max_chars))
            answer = choice_batch(base, self.scorer, self.choose, self.k, show, chosen,
                                  own=self.choose_own, edits=self.choose_edits)
        elif memory is not None:
            answer = memory_batch(base, memory, self.k, self.max_chars)
        else:
            answer = task_blind(base)
        tally: dict[str, int] = {"lookup": 0, "model": 0}
        if self.hybrid is not None:
            answer = hybrid_batch(answer, self.hybrid, tally)

        def block() -> dict[str, Any]:
            out: dict[str, Any] = {}
            if self.memory is not None:
                out["memory"] = {"file": self.memory.source, "k": self.k,
                                 "calls": len(self.memory), "note_chars": self.max_chars}
            if self.choose is not None:
                out["choice"] = {"file": self.choose.source, "k": self.k,
                                 "calls": len(self.choose),
                                 "among": "all" if self.choose_own else "memory",
                                 "edits": self.choose_edits,
                                 "chosen": dict(chosen)}
            if self.hybrid is not None:
                out["hybrid"] = {"file": self.hybrid.source, "calls": len(self.hybrid),
                                 "answered_by_lookup": tally["lookup"],
                                 "answered_by_model": tally["model"]}
            return {"world_model": out}

        return answer, block
