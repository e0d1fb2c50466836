"""The teacher-forced one-step audit: a world model rehearses each call given the *real* history.

    from audit.probe import run_probe
    opts = AuditOptions(reference="train.jsonl")
    summary = run_probe(["dev.jsonl"], "probe_out", rehearser, opts)

For every trajectory the real environment is reset and its calls are executed in order, as
`audit.replay` does. Before each call is executed, the rehearser is asked what the call will
return, seeing the conversation up to and including the assistant message that makes the call,
with every earlier tool response replaced by the *real* one. Its answer is scored against the
real response exactly as replay scores a recorded rehearsal (same step-record fields,
`source_rehearsed: true`), so the directory written (`steps.jsonl`, `trajectories.jsonl`,
`summary.json`, `report.md`) reads like any audit. Comparing it with the free-running audit of the
same model's own rollouts separates one-step error from the error that self-conditioning adds.

The model under audit is any world model (`envace.core.worldmodel.WorldModel`, a callable
`(messages, tools, tool_name, arguments) -> str`); a neural one is driven by `envace probe`
(`envace.cli.probe`; this module never imports torch). One that cannot answer (a served model
that timed out) raises `Unanswered(reason)`: the step is recorded unanswered, with
`unanswered_reason`. A reference world model fits through `envace.core.worldmodel.from_lookup`;
since it ignores the history, its probe fidelity equals its baseline audit fidelity.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from audit.pipeline import reference_triples
from audit.probe_stream import stream_probe
from audit.replay import (
    MAX_HISTORY_CHARS,
    RealCalls,
    ReplayError,
    TrajectoryAudit,
    _changed,
    _message_text,
    _reset,
    check_actual_size,
    check_sizes,
    step_record,
    trajectory_row,
)
from audit.scoring.settings import AuditOptions
from audit.stats.confidence import confidence_of
from audit.stats.history import HISTORIES
from audit.stats.population import assign_depths
from audit.stats.summary import build_summary, compact
from audit.store.models import skipped_row
from audit.store.output import AuditWriter
from audit.worlds.reference import REFERENCE_NAMES, build_reference
from envace.core.envs.base import Environment
from envace.core.schema import Message, Trajectory, read_trajectories
from envace.core.worldmodel import Unanswered, WorldModel

#: one request to a world model: (messages so far, tool schemas, tool name, arguments)
Request = tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str, dict[str, Any]]
ProbeSteps = Generator[Request, Any, TrajectoryAudit]
#: answers a batch of requests in order: the text, or an `Unanswered` for a step with no answer.
#: One whose ``keyed`` attribute is true is also given ``keys=``: each request's
#: ``(history, trajectory id)``; a key missing from a round is a trajectory that has ended (a
#: world model that keeps state per conversation, e.g. its KV cache, may drop it then), and a
#: last round with no request at all ends them all
BatchAnswer = Callable[[list[Request]], list["str | Unanswered"]]
#: adds fields to a chunk's records before they are written: (trajectories, audit or exception)
Annotate = Callable[[list[Trajectory], list["TrajectoryAudit | Exception"]], None]
CHUNK = 64  # trajectories probed together (one round asks each of them once)
#: `envace probe --history`: the histories each value rehearses from
HISTORY_CHOICES = {"real": ("real",), "own": ("own",), "both": ("real", "own")}


def _real_tool_message(m: Message, content: str, error: bool) -> dict[str, Any]:
    d = m.dump()
    d.update(content=content, rehearsed=False)
    d.pop("logprob", None)
    d.pop("num_tokens", None)
    if error:
        d["error"] = True
    else:
        d.pop("error", None)
    return d


def _own_tool_message(m: Message, content: str) -> dict[str, Any]:
    """A tool message holding the world model's own earlier answer (history "own")."""
    d = m.dump()
    d.update(content=content, rehearsed=True)
    for k in ("logprob", "num_tokens", "error"):
        d.pop(k, None)
    return d


def probe_trajectory(
    traj: Trajectory,
    rehearser: WorldModel,
    settings: AuditOptions,
    env_cache: dict[str, Environment] | None = None,
    steps: Iterable[int] | None = None,
    history: str = "real",
) -> TrajectoryAudit:
    """Teacher-forced audit of one trajectory; raises `ReplayError` if it cannot start.

    `steps`: only ask the rehearser at these step indices (all calls are still executed, in
    order, so the state stays real); None asks at every call. `history`: ``"real"`` (the
    teacher-forced probe) shows the world model the real responses of earlier calls;
    ``"own"`` (the self-conditioned probe) shows it its own earlier answers instead (calls
    still forced from the trajectory; an unasked or unanswered step keeps its real response).
    Each record carries ``history``.
    """
    return drive(probe_steps(traj, settings, env_cache, steps, history), rehearser)


def drive(gen: ProbeSteps, world_model: WorldModel) -> TrajectoryAudit:
    """Run one trajectory's probe, answering each request with `world_model` as it comes."""
    reply: str | Unanswered | None = None
    first = True
    while True:
        try:  # only the probe's own end is a StopIteration here, never the world model's
            request = next(gen) if first else gen.send(reply)
        except StopIteration as stop:
            return stop.value
        first = False
        try:
            reply = world_model(*request)
        except Unanswered as exc:
            reply = exc


def probe_batched(
    trajs: Sequence[Trajectory],
    answer_batch: Callable[[list[Request]], list[str | Unanswered]],
    settings: AuditOptions,
    steps: Mapping[str, Iterable[int]] | None = None,
    history: str = "real",
    task_ids: bool = False,
) -> list[TrajectoryAudit | Exception]:
    """Probe many trajectories at once, asking in rounds: each round sends every live
    trajectory's next request to `answer_batch` (one list, answers in the same order; an
    `Unanswered` answer marks that step unanswered). With ``history="own"`` a request depends on
    the answers before it, so rounds are what make batching possible at all. Each trajectory has
    its own environment. Per trajectory: its audit, or the exception that stopped it (e.g.
    `ReplayError`). `task_ids`: `answer_batch` is called with a second list, each request's
    task id (a memory of real responses must not answer from the task's own scenario:
    `audit.worlds.memory`). A ``keyed`` `answer_batch` is given each request's key too
    (`BatchAnswer`). An `answer_batch` with a ``stream(first, answered)`` method (the kept-cache
    answerer, `envace.evaluation.model_probe.kept_answers`) is not asked in rounds: it is given
    every trajectory's first request keyed ``(history, index)`` and calls ``answered(key,
    text)`` as each answer ends, which advances that trajectory at once and returns its next
    request (or None: it has ended), so a trajectory never waits for the round's slowest answer.
    The audits are the same as in rounds: each trajectory's requests and answers do not depend
    on the order in which trajectories are answered."""
    stream = getattr(answer_batch, "stream", None)
    if stream is None or task_ids:
        return _probe_rounds(trajs, answer_batch, settings, steps, history, task_ids)
    results: dict[int, TrajectoryAudit | Exception] = {}
    live: dict[int, tuple[ProbeSteps, Request]] = {}
    for i, traj in enumerate(trajs):
        wanted = None if steps is None else steps.get(traj.id, ())
        _advance(live, results, i, probe_steps(traj, settings, None, wanted, history), first=True)

    def answered(key: tuple[str, int], reply: str) -> Request | None:
        _advance(live, results, key[1], live[key[1]][0], reply)
        return live[key[1]][1] if key[1] in live else None

    stream([((history, i), live[i][1]) for i in sorted(live)], answered)
    return [results.get(i, RuntimeError("not probed")) for i in range(len(trajs))]


def _advance(live: dict[Any, tuple[ProbeSteps, Request]], results: dict[Any, Any], key: Any,
             gen: ProbeSteps, reply: Any = None, first: bool = False) -> None:
    """Move one trajectory's probe to its next request (``live``), or record how it ended
    (``results``: its audit, or the exception that stopped it)."""
    try:
        live[key] = (gen, next(gen) if first else gen.send(reply))
    except StopIteration as stop:
        live.pop(key, None)
        results[key] = stop.value
    except Exception as exc:  # noqa: BLE001 - one trajectory's failure is its result
        live.pop(key, None)
        results[key] = exc


def _probe_rounds(trajs: Sequence[Trajectory],
                  answer_batch: Callable[[list[Request]], list[str | Unanswered]],
                  settings: AuditOptions, steps: Mapping[str, Iterable[int]] | None,
                  history: str, task_ids: bool) -> list[TrajectoryAudit | Exception]:
    """One history's trajectories asked in rounds (:func:`probe_batched`)."""
    results: dict[int, TrajectoryAudit | Exception] = {}
    live: dict[int, tuple[ProbeSteps, Request]] = {}
    for i, traj in enumerate(trajs):
        wanted = None if steps is None else steps.get(traj.id, ())
        _advance(live, results, i, probe_steps(traj, settings, None, wanted, history), first=True)
    keyed = bool(getattr(answer_batch, "keyed", False))
    while live:
        order = sorted(live)
        requests = [live[i][1] for i in order]
        kw = {"keys": [(history, trajs[i].id) for i in order]} if keyed else {}
        answers = (answer_batch(requests, [trajs[i].task_id for i in order], **kw)  # type: ignore[call-arg]
                   if task_ids else answer_batch(requests, **kw))
        if len(answers) != len(order):
            raise ValueError(f"answer_batch gave {len(answers)} answers for {len(order)} requests")
        for i, reply in zip(order, answers, strict=True):
            _advance(live, results, i, live[i][0], reply)
    if keyed:  # a round with no request: every trajectory has ended
        answer_batch([], [], keys=[]) if task_ids else answer_batch([], keys=[])  # type: ignore[call-arg]
    return [results.get(i, RuntimeError("not probed")) for i in range(len(trajs))]


def probe_steps(
    traj: Trajectory,
    settings: AuditOptions,
    env_cache: dict[str, Environment] | None = None,
    steps: Iterable[int] | None = None,
    history: str = "real",
) -> ProbeSteps:
    """The probe of one trajectory as a generator: it yields each request (the world model's
    arguments), is sent the answer (text, or an `Unanswered`), and returns the audit."""
    if history not in HISTORIES:
        raise ValueError(f"history must be one of {HISTORIES}, got {history!r}")
    tool_steps = traj.tool_steps()
    check_sizes(tool_steps)  # docs/audit.md, size limits: one skipped record, before any call
    env, _ = _reset(env_cache if env_cache is not None else {}, traj, settings.limits)
    wanted = None if steps is None else set(steps)
    answer_of = {id(st.response): st for st in tool_steps if st.response is not None}
    calls_of: dict[int, list[Any]] = defaultdict(list)
    for st in tool_steps:
        calls_of[st.message_index].append(st)
    shown_so_far: list[dict[str, Any]] = []  # the messages so far, tool answers as `history`
    texts: list[str] = []
    real: dict[int, tuple[str, bool]] = {}  # step -> (actual response, error)
    own: dict[int, str] = {}  # step -> the world model's answer (history "own")

    def shown(m: Message, step: int) -> dict[str, Any]:
        if history == "own" and step in own:
            return _own_tool_message(m, own[step])
        return _real_tool_message(m, *real[step])

    records: list[dict[str, Any]] = []
    calls = RealCalls(env, settings.state_change)
    if env_cache is None and hasattr(env, "execute_many"):
        # an environment of its own (the batched probe holds up to `chunk` trajectories at
        # once): the recorded calls do not depend on the world model's answers, so run them
        # now in one round trip, learn their tools' kinds, and end its process before the
        # first question; one child at a time instead of one per live trajectory (~300 MB each)
        calls.prefetch(tool_steps)
        for st in tool_steps:
            env.tool_kind(st.tool)
        env.close()
    for index, m in enumerate(traj.messages):
        answered = answer_of.get(id(m))
        if answered is not None and answered.step in real:
            shown_so_far.append(shown(m, answered.step))
        else:
            shown_so_far.append(m.dump())
        texts.append(_message_text(m))
        for st in calls_of.get(index, []):
            # earlier calls of the same message are answered (really) before this one is asked
            so_far = shown_so_far + [shown(s.response, s.step) for s in calls_of[index]
                                     if s.step < st.step and s.response is not None]
            asked = wanted is None or st.step in wanted
            rehearsed = why = None
            if asked:
                reply = yield (so_far, traj.tools, st.tool, dict(st.arguments or {}))
                if isinstance(reply, Unanswered):
                    why = str(reply) or "no answer"
                else:
                    rehearsed = reply
                if rehearsed is not None:
                    own[st.step] = str(rehearsed)
            actual_text, actual_error = calls.execute(st)
            check_actual_size(st, actual_text)  # as the replay: one record, never a writer's
            real[st.step] = (actual_text, actual_error)
            if asked:
                history_text = "\n".join(texts)[-MAX_HISTORY_CHARS:]
                records.append(_record(traj, st, rehearsed, actual_text, actual_error, env,
                                       history_text, settings,
                                       _changed(calls.state_change(st.step))))
                records[-1]["history"] = history
                calls.mark(records[-1], st.step)
                if calls.track_state:
                    records[-1]["state_change"] = calls.state_change(st.step)
                if why is not None:
                    records[-1]["unanswered_reason"] = why
    assign_depths(records)
    return TrajectoryAudit(records, calls.warnings(), trajectory_row(traj, records))


def _record(traj: Trajectory, st: Any, rehearsed: str | None, actual_text: str,
            actual_error: bool, env: Environment, history_text: str,
            settings: AuditOptions, state_changed: bool | None = None) -> dict[str, Any]:
    """One step record with the fields and scoring of `audit.replay` (marked as a probe); an
    answer that carries its own log-probability (`audit.stats.confidence.Rehearsal`) gives the
    record its `confidence` (and `confidence_min`)."""
    conf = confidence_of(rehearsed)
    rehearsed = None if rehearsed is None else str(rehearsed)
    rec = step_record(traj, st, rehearsed, None, True, actual_text, actual_error, env,
                      history_text, settings, state_changed=state_changed)
    rec["probe"] = "teacher_forced"
    rec.update(conf)
    return rec


def probe_settings(opts: AuditOptions) -> AuditOptions:
    """Audit settings of `opts`, with reference world models when `opts.reference` is set."""
    refs = {}
    if opts.reference:
        triples = reference_triples(opts.reference)
        refs = {n: build_reference(n, triples) for n in REFERENCE_NAMES}
    return replace(opts, references=refs)


def run_probe(
    paths: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    rehearser: WorldModel | None = None,
    opts: AuditOptions | None = None,
    limit: int = 0,
    label: str | None = None,
    steps: Mapping[str, Iterable[int]] | None = None,
    progress: Callable[[int], None] | None = None,
    extra: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    *,
    histories: Sequence[str] = ("real",),
    answer_batch: BatchAnswer | None = None,
    chunk: int = CHUNK,
    task_ids: bool = False,
    annotate: Annotate | None = None,
) -> dict[str, Any]:
    """Probe every trajectory of `paths` (at most `limit` when > 0); write the audit directory.

    The world model is `rehearser` (asked one call at a time, trajectory by trajectory) or
    `answer_batch` (asked over `chunk` trajectories at once in rounds, `probe_batched`; or,
    where it streams, with `chunk` conversations (a trajectory under one history) live at once,
    the next starting as one ends, `audit.probe_stream`).
    `histories`: ``("real",)`` the teacher-forced probe; ``("own",)`` the self-conditioned one;
    both: every step is probed twice, the rows carry ``history``, the statistics count the
    real-history rows and the summary decomposes the two (``history`` block, `audit.stats.history`).
    `steps`: trajectory id -> step indices to probe (trajectories not named are skipped
    silently); `label` names the audited model in the summary, `extra` adds summary fields
    (a callable: asked once the probe is done). Returns the summary. Unreadable or
    unreplayable records are reported with file and line, never fatal. The directory is
    written like every audit's (``audit.store.output``: renamed into place when complete, never
    over an input or another tool's files). `task_ids`: `answer_batch` is also given each
    request's task id (`probe_batched`). `annotate`: called with each chunk's trajectories and
    their audits (or exceptions), before the rows are written, to add fields to the records
    (the likelihood audit, `audit.likelihood_probe`).
    """
    if (rehearser is None) == (answer_batch is None):
        raise ValueError("give exactly one of rehearser and answer_batch")
    if task_ids and answer_batch is None:
        raise ValueError("task_ids needs answer_batch")
    bad = [h for h in histories if h not in HISTORIES] or ([] if histories else ["(none)"])
    if bad or len(set(histories)) != len(histories):
        raise ValueError(f"histories must be distinct values of {HISTORIES}, got {histories!r}")
    opts = opts or AuditOptions()
    inputs = [str(p) for p in paths]
    with AuditWriter(out_dir, [*inputs, opts.reference]) as w:
        summary = _probe_into(w, inputs, rehearser, answer_batch, tuple(histories), chunk, opts,
                              limit, label, steps, progress, extra, task_ids, annotate)
        return w.finish(summary, plots=opts.plots)


def _readable(inputs: list[str], limit: int, steps: Mapping[str, Iterable[int]] | None,
              skipped: list[dict[str, Any]]) -> Iterator[Any]:
    """The records to probe, in file order (unreadable ones go to `skipped`); `limit` counts
    the trajectories handed out. A trajectory whose id was handed out already is handed out
    unreadable, with the reason (steps, and both histories' verdicts, are keyed by id)."""
    given = 0
    first: dict[str, tuple[str, int]] = {}
    for path in inputs:
        if not Path(path).exists():
            skipped.append(skipped_row(path, None, "file not found"))
            continue
        for item in read_trajectories(path):
            if limit and given >= limit:
                return
            traj = item.trajectory
            if traj is not None and steps is not None and traj.id not in steps:
                continue
            if traj is not None and traj.id in first:
                f, ln = first[traj.id]
                item = replace(item, trajectory=None,
                               error=f"duplicate trajectory id {traj.id!r:.80} (first at "
                                     f"{f}:{ln}, which is probed); skipped")
            elif traj is not None:
                first[traj.id] = (item.path, item.line)
            given += item.trajectory is not None
            yield item


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _one_at_a_time(trajs: list[Trajectory], rehearser: WorldModel, settings: AuditOptions,
                   env_cache: dict[str, Environment], steps: Mapping[str, Iterable[int]] | None,
                   history: str) -> list[TrajectoryAudit | Exception]:
    out: list[TrajectoryAudit | Exception] = []
    for traj in trajs:
        try:
            out.append(probe_trajectory(traj, rehearser, settings, env_cache,
                                        None if steps is None else steps[traj.id], history))
        except Exception as exc:  # noqa: BLE001 - one trajectory's failure is its result
            out.append(exc)
    return out


def _failure(exc: Exception) -> str:
    if isinstance(exc, ReplayError):
        return f"cannot replay: {exc}"
    return f"probe failed: {type(exc).__name__}: {exc}"


def _probe_into(w: AuditWriter, inputs: list[str], rehearser: WorldModel | None,
                answer_batch: BatchAnswer | None, histories: tuple[str, ...], chunk: int,
                opts: AuditOptions, limit: int, label: str | None,
                steps: Mapping[str, Iterable[int]] | None,
                progress: Callable[[int], None] | None,
                extra: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None,
                task_ids: bool = False, annotate: Annotate | None = None) -> dict[str, Any]:
    settings = probe_settings(opts)
    env_cache: dict[str, Environment] = {}
    skipped: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    read = done = 0
    t0 = time.perf_counter()

    def emit(item: Any, res: list[Any] | None) -> None:
        """One record's outcome, in input order: its rows written, or why it was skipped."""
        nonlocal read, done
        read += 1
        if item.trajectory is None or res is None:
            skipped.append(skipped_row(item.path, item.line, item.error))
            return
        failed = next((r for r in res if isinstance(r, Exception)), None)
        if failed is not None:  # a bug or a hostile record must not stop the audit
            skipped.append(skipped_row(item.path, item.line, _failure(failed)))
            return
        done += 1
        for msg in dict.fromkeys(m for r in res for m in r.warnings):
            warnings.append({"file": item.path, "line": item.line,
                             "trajectory_id": item.trajectory.id, "message": msg})
        records = [rec for r in res for rec in r.steps]
        w.write_steps(records, {**res[0].summary, "file": item.path, "line": item.line})
        rows.extend(compact(rec) for rec in records)
        if progress is not None:
            progress(len(records))

    stream = getattr(answer_batch, "stream", None)
    items = _readable(inputs, limit, steps, skipped)
    streamed = stream is not None and not task_ids and annotate is None
    if streamed:  # one stream for every history and record, `chunk` conversations at once
        stream_probe(items, lambda traj, wanted, h: probe_steps(traj, settings, None, wanted, h),
                     stream, steps, histories, max(1, chunk), emit)
    for batch in [] if streamed else _chunks(items, max(1, chunk)):
        good = [i for i in batch if i.trajectory is not None]
        trajs = [i.trajectory for i in good]
        position = {id(i): k for k, i in enumerate(good)}
        results = {h: (probe_batched(trajs, answer_batch, settings, steps, h, task_ids)
                       if answer_batch is not None else
                       _one_at_a_time(trajs, rehearser, settings, env_cache, steps, h))
                   for h in histories}
        if annotate is not None:
            for h in histories:
                annotate(trajs, results[h])
        for item in batch:
            emit(item, None if item.trajectory is None else
                 [results[h][position[id(item)]] for h in histories])
    summary = build_summary(rows, opts, trajectories=done, read=read, skipped=skipped,
                            warnings=warnings, inputs=inputs, seconds=time.perf_counter() - t0)
    summary["audited_model"] = label
    summary["probe"] = "teacher_forced" if histories == ("real",) else (
        "self_conditioned" if histories == ("own",) else "teacher_forced+self_conditioned")
    if histories != ("real",):
        summary["histories"] = list(histories)
    summary.update((extra() if callable(extra) else extra) or {})
    return summary
