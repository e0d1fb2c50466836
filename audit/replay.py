"""Open-loop replay: pair every recorded tool response with what the real environment returns.

For each trajectory the real environment is reset to the trajectory's initial state (a task id
or inline state) and its calls are executed in order. Each call gives one *step record* (the
`steps.jsonl` row of the spec): the recorded (rehearsed) response, the actual one, the scores and
the divergence verdict. A malformed call is answered as the environment answers an invalid call
(an error), an unanswered call is kept and flagged, a call to a tool the task does not have is
executed (an error result) and named in a warning.

``replay_trajectory`` is pure apart from the environment; ``audit.pipeline`` streams files
through it (in worker processes when asked) and writes the audit directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from audit.scoring.canonical import is_error_response
from audit.scoring.fast import score_fast
from audit.scoring.scorers import ScoreContext
from audit.scoring.settings import AuditOptions, Override
from audit.stats.confidence import mean_token_logprob
from audit.stats.population import assign_depths, is_rehearsed
from audit.stats.steps import novelty, tokens
from envace.core.envs.base import Environment
from envace.core.envs.guard import guarded_env
from envace.core.envs.limits import CallLimits
from envace.core.envs.statediff import StateTracker
from envace.core.envs.task_common import UnknownTask
from envace.core.schema import MAX_CALL_BYTES, Trajectory, json_text, utf8_len

MAX_HISTORY_CHARS = 200_000  # novelty looks at most at this much of the history


class History:
    """The visible history of one trajectory's calls, grown message by message, with the set
    of its (lower-cased) tokens kept as it grows, so that a step's novelty costs its own
    response, not the whole history again. A history past ``MAX_HISTORY_CHARS`` (novelty then
    reads its tail only) is tokenised afresh, as before. Messages are joined by a newline,
    which no token spans, so the tokens of the whole are the union of the messages'."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.chars = -1  # length of the joined text
        self.tokens: set[str] = set()
        self._text: str | None = ""
        #: the last text :meth:`novelty` tokenised, and its tokens: a real response is scored
        #: and then joins the history as the next step's tool message, tokenised once
        self._last: tuple[str, list[str]] = ("", [])

    def _tokens(self, text: str) -> list[str]:
        if text == self._last[0]:
            return self._last[1]
        return tokens(text)

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.chars += len(text) + 1
        self._text = None
        if self.chars <= MAX_HISTORY_CHARS:
            self.tokens.update(self._tokens(text))

    def text(self) -> str:
        """The history as the scorers see it: its last ``MAX_HISTORY_CHARS`` characters."""
        if self._text is None:
            self._text = "\n".join(self.parts)[-MAX_HISTORY_CHARS:]
        return self._text

    def novelty(self, actual: str) -> float:
        """:func:`audit.stats.compounding.novelty` of ``actual`` against this history."""
        if self.chars > MAX_HISTORY_CHARS:
            return novelty(actual, self.text())
        found = self._tokens(actual)
        self._last = (actual, found)
        if not found:
            return 0.0
        return (len(found) - sum(map(self.tokens.__contains__, found))) / len(found)


class ReplayError(Exception):
    """A trajectory that cannot be replayed at all (unknown env or task, bad inline state)."""


@dataclass
class TrajectoryAudit:
    """The step records of one trajectory, and warnings about it."""

    steps: list[dict[str, Any]]
    warnings: list[str]
    summary: dict[str, Any]


def _reset_op(env: Environment, traj: Trajectory) -> tuple[str, Any]:
    """How the environment is reset to the trajectory's start: ``reset_record`` with the whole
    env record where it has one (a record with more than the task id: a version), else
    ``reset`` with the task id or the inline state."""
    if hasattr(env, "reset_record"):
        return "reset_record", traj.env
    return "reset", traj.env["task"] if "task" in traj.env else traj.env["state"]


def _reset(env_cache: dict[str, Environment], traj: Trajectory,
           limits: CallLimits | None = None, batch: list[tuple[str, Any]] | None = None,
           track_state: bool = False, ahead: Any = None, tools: tuple[Any, ...] = ()
           ) -> tuple[Environment, Iterator[Any] | None]:
    """The trajectory's environment (one per name in ``env_cache``, every call under ``limits``:
    ``envace.core.envs.guard``), reset to its initial state; and, where the environment runs
    in its own process and ``batch`` is given, the results of those calls, asked for in the
    same message as the reset (``GuardedEnv.begin_many``: one round trip per trajectory), or
    already sent (``ahead``: :func:`send_ahead`)."""
    name = traj.env.get("name")
    try:
        env = env_cache.get(name) or env_cache.setdefault(name, guarded_env(name, limits))
    except KeyError as exc:
        raise ReplayError(str(exc)) from None
    op, arg = _reset_op(env, traj)
    results = None
    try:
        if ahead is not None and getattr(ahead, "env", None) is env:
            results = env.take_ahead(ahead)
        elif batch is not None and hasattr(env, "begin_many"):
            results = env.begin_many(op, arg, batch, track_state=track_state, tools=tools)
        else:
            getattr(env, op)(arg)
    except UnknownTask as exc:
        raise ReplayError(str(exc)) from None
    except Exception as exc:  # an inline state of the wrong shape, whatever the backend raises
        raise ReplayError(f"cannot reset {name} to this state: {type(exc).__name__}: "
                          f"{str(exc)[:200]}") from None
    return env, results


def send_ahead(traj: Trajectory, settings: AuditOptions,
               env_cache: dict[str, Environment], line_bytes: int | None = None) -> Any:
    """Send the trajectory's reset and calls to its environment's process now (an environment
    already started, in its own process), to be read by :func:`replay_trajectory` with
    ``ahead=``: the process runs them while the audit scores the trajectory before. None
    where nothing was sent (the replay then asks as ever). ``line_bytes``: as for
    :func:`replay_trajectory`."""
    env = env_cache.get(traj.env.get("name"))
    if env is None or not hasattr(env, "send_ahead"):
        return None
    if not getattr(env, "can_send_ahead", lambda: True)():
        return None  # the queue is full: nothing to build (it is asked again later)
    try:
        steps = traj.tool_steps()
        if not sizes_certain(line_bytes):
            check_sizes(steps)
        op, arg = _reset_op(env, traj)
        ahead = env.send_ahead(op, arg, RealCalls.batch(steps), settings.state_change,
                               tools=step_tools(steps))
    except Exception:  # noqa: BLE001 - the replay meets (and reports) the same problem
        return None
    if ahead is not None:
        ahead.note = (traj, steps)  # parsed and checked once: the replay takes them
    return ahead


def step_tools(steps: list[Any]) -> tuple[Any, ...]:
    """The tools of a trajectory's steps (malformed calls' too), once each, in order: the
    kinds the replay asks before it scores."""
    return tuple(dict.fromkeys(st.tool for st in steps))


def _message_text(m: Any) -> str:
    parts = [m.content or ""]
    for c in m.tool_calls or []:
        args = c.function.arguments
        parts.append(c.function.name + " " + (args if isinstance(args, str) else json.dumps(args)))
    return "\n".join(parts)


class RealCalls:
    """The real environment's answers to one trajectory's calls, executed in order from its
    reset state: a malformed call answers an error without running; a call of a tool the task
    does not offer runs and is named in the trajectory's warnings."""

    def __init__(self, env: Environment, track_state: bool = True) -> None:
        self.env = env
        self.offered = env.tool_names() if hasattr(env, "tool_names") else None
        self.unknown: list[str] = []
        self.timed_out: set[int] = set()  # steps whose call ran past its limit
        self.crashed: set[int] = set()  # steps whose call's process died
        self._ahead: dict[int, Any] = {}
        #: ``track_state``: how each call changed the real state (``statediff``), by step
        self.track_state = track_state
        self.state_changes: dict[int, dict[str, Any] | None] = {}
        self._tracker = StateTracker(env) if track_state else None

    @staticmethod
    def batch(steps: list[Any]) -> list[tuple[str, Any]]:
        """The calls :meth:`prefetch` runs: every well-formed call of ``steps``, in order."""
        return [(st.tool, st.arguments) for st in steps if st.malformed is None]

    def prefetch(self, steps: list[Any], results: Iterator[Any] | None = None) -> None:
        """Run every well-formed call of ``steps`` now, in order, in one batch where the
        environment can (a guarded one: one round trip to its process, not one per call);
        ``results``: theirs, asked for already (with the reset)."""
        if results is None and not hasattr(self.env, "execute_many"):
            return
        todo = [st for st in steps if st.malformed is None]
        if results is None:
            batch = self.batch(steps)
            results = (self.env.execute_many(batch, track_state=True) if self.track_state
                       else self.env.execute_many(batch))
        for st, res in zip(todo, results, strict=True):
            self._ahead[st.step] = res

    def execute(self, st: Any) -> tuple[str, bool]:
        """(text, is an error) of the real response to tool step ``st``."""
        if st.malformed is not None:  # not run: the state is unchanged
            if self.track_state:
                self.state_changes[st.step] = {"leaves": 0, "paths": []}
            return f"Error during execution: malformed call: {st.malformed}", True
        if self.offered is not None and st.tool not in self.offered:
            self.unknown.append(st.tool)
        res = self._ahead.pop(st.step, None)
        if res is None and self.track_state and hasattr(self.env, "execute_many"):
            # diffed in the environment's process: no state crosses the pipe
            (res,) = list(self.env.execute_many([(st.tool, st.arguments)], track_state=True))
        elif res is None:
            res = (self._tracker.execute(st.tool, st.arguments) if self._tracker is not None
                   else self.env.execute(st.tool, st.arguments))
        if getattr(res, "timeout", False):
            self.timed_out.add(st.step)
        if getattr(res, "crashed", False):
            self.crashed.add(st.step)
        if self.track_state:
            self.state_changes[st.step] = getattr(res, "state_change", None)
        return res.content, res.error

    def mark(self, rec: dict[str, Any], step: int) -> None:
        """Mark step row ``rec`` ``timeout`` / ``crashed`` when its real call was so ended."""
        if step in self.timed_out:
            rec["timeout"] = True
        if step in self.crashed:
            rec["crashed"] = True

    def state_change(self, step: int) -> dict[str, Any] | None:
        """How call ``step`` changed the real state (None: not tracked or unreadable)."""
        return self.state_changes.get(step)

    def warnings(self) -> list[str]:
        if not self.unknown:
            return []
        return [f"calls tools the task does not have: {', '.join(sorted(set(self.unknown)))}"]


def replay_trajectory(
    traj: Trajectory,
    settings: AuditOptions,
    env_cache: dict[str, Environment] | None = None,
    override: Override | None = None,
    ahead: Any = None,
    then: Callable[[], None] | None = None,
    line_bytes: int | None = None,
) -> TrajectoryAudit:
    """Replay one trajectory; raises :class:`ReplayError` if it cannot start at all, or holds
    a call or a response past ``MAX_CALL_BYTES`` (checked before the environment runs).
    ``ahead``: its calls as :func:`send_ahead` sent them; ``then``: called once its real
    calls are answered, before they are scored (the audit sends the next trajectory's
    there; the tools' kinds are asked first, so scoring sends the environment nothing).
    ``line_bytes``: the bytes of the JSON line the trajectory was read from, unchanged since:
    a short line cannot hold a call past the limit, so none is measured
    (:func:`sizes_certain`)."""
    note = getattr(ahead, "note", None)
    if note is not None and note[0] is traj:  # parsed and checked when it was sent ahead
        steps = note[1]
    else:
        steps = traj.tool_steps()
        if not sizes_certain(line_bytes):
            check_sizes(steps)
    tools = step_tools(steps)
    env, results = _reset(env_cache if env_cache is not None else {}, traj, settings.limits,
                          RealCalls.batch(steps), settings.state_change, ahead, tools)
    history = History()
    seen_upto = 0
    records: list[dict[str, Any]] = []
    calls = RealCalls(env, settings.state_change)
    calls.prefetch(steps, results)
    if then is not None:
        for tool in tools:
            try:
                env.tool_kind(tool)  # kept by the environment (a guarded one has it already:
                # its process sends the kinds of these tools after the batch)
            except Exception:  # noqa: BLE001 - the step's own record meets it again
                break
        then()
    for st in steps:
        for m in traj.messages[seen_upto: st.message_index + 1]:
            history.add(_message_text(m))
        seen_upto = st.message_index + 1
        actual_text, actual_error = calls.execute(st)
        check_actual_size(st, actual_text)
        resp = st.response
        if override is not None:
            rehearsed = override(st.tool, st.arguments or {})
            written_error, flag = None, True
        else:
            rehearsed = resp.content if resp is not None else None
            written_error = resp.error if resp is not None else None
            flag = resp.rehearsed if resp is not None else None
        rec = step_record(traj, st, rehearsed, written_error, flag, actual_text, actual_error,
                          env, history.text(), settings, history.novelty(actual_text),
                          _changed(calls.state_change(st.step)))
        calls.mark(rec, st.step)
        if calls.track_state:
            rec["state_change"] = calls.state_change(st.step)
        if override is None and resp is not None and resp.rehearsed is not False:
            conf = mean_token_logprob(resp.logprob, resp.num_tokens)  # audit.stats.confidence
            if conf is not None and rehearsed is not None:
                rec["confidence"] = conf
        records.append(rec)
    assign_depths(records)
    return TrajectoryAudit(records, calls.warnings(), trajectory_row(traj, records))


def check_actual_size(st: Any, actual_text: str) -> None:
    """:class:`ReplayError` when the real response passes ``MAX_CALL_BYTES``."""
    if len(actual_text) > MAX_CALL_BYTES // 4 and utf8_len(actual_text) > MAX_CALL_BYTES:
        raise ReplayError(f"call {st.step} ({str(st.tool)[:80]!r}): the real response of "
                          f"{utf8_len(actual_text)} bytes is past the {MAX_CALL_BYTES}-byte "
                          "limit of a response (docs/audit.md, size limits)")
def _changed(change: dict[str, Any] | None) -> bool | None:
    """Whether a recorded state change changed anything (None: unknown)."""
    return None if change is None else change["leaves"] > 0


#: how many times its bytes in a JSON line a value parsed from it can take once written back by
#: ``json_text``: a float literal grows most (``1e15``, 4 bytes, is written
#: ``1000000000000000.0``: 4.5 times), a separator twice (``,`` is ``, ``), a string at most
#: 3 times (written with ``\u`` escapes when it holds a lone surrogate), the rest not at all
#: (tests/audit/test_size_bound.py checks it)
GROWTH = 5


def sizes_certain(line_bytes: int | None) -> bool:
    """Whether a trajectory read from a JSON line of ``line_bytes`` bytes (None: not known)
    surely passes :func:`check_sizes`: its calls' arguments, written back, take at most
    ``GROWTH`` times the line's bytes, a recorded response at most the line's bytes. The
    audit's BFCL lines (21.5 kB) are far below the bound (~210 kB): it measures no call."""
    return line_bytes is not None and line_bytes * GROWTH <= MAX_CALL_BYTES


def check_sizes(steps: list[Any]) -> None:
    """:class:`ReplayError` for a call whose arguments or recorded response pass
    ``MAX_CALL_BYTES`` (docs/audit.md, "Size limits")."""
    for st in steps:
        args = st.arguments if st.arguments is not None else st.raw_arguments
        text = args if isinstance(args, str) else json_text(args)
        for what, value in (("arguments", text),
                            ("recorded response", st.response.content if st.response else None)):
            if (isinstance(value, str) and len(value) > MAX_CALL_BYTES // 4
                    and utf8_len(value) > MAX_CALL_BYTES):
                raise ReplayError(f"call {st.step} ({str(st.tool)[:80]!r}): its {what} of "
                                  f"{utf8_len(value)} bytes pass the {MAX_CALL_BYTES}-byte limit "
                                  "of a call (docs/audit.md, size limits)")


def step_record(traj: Trajectory, st: Any, rehearsed: str | None, written_error: bool | None,
                source_rehearsed: bool | None, actual_text: str, actual_error: bool,
                env: Environment, history_text: str, settings: AuditOptions,
                novelty_value: float | None = None,
                state_changed: bool | None = None) -> dict[str, Any]:
    """One ``steps.jsonl`` row: the call, both responses, scores, verdict, references
    (``novelty_value``: the response's novelty when the caller knows it already;
    ``state_changed``: whether the real call changed the state, ``statediff``, the
    ``state_change`` scorer's observation, None when unknown)."""
    kind = env.tool_kind(st.tool)
    rec: dict[str, Any] = {
        "trajectory_id": traj.id,
        "task_id": traj.task_id,
        "env_name": traj.env.get("name"),
        "step": st.step,
        "tool": st.tool,
        "arguments": st.arguments if st.arguments is not None else st.raw_arguments,
        "rehearsed": rehearsed,
        "actual": actual_text,
        "actual_error": actual_error,
        "mutates_state": None if kind is None else kind == "write",
        "source_rehearsed": source_rehearsed,
        "malformed": st.malformed,
        "unanswered": rehearsed is None,
        "novelty": (novelty(actual_text, history_text) if novelty_value is None
                    else novelty_value),
    }
    if rehearsed is None:
        rec.update(scores={}, diverged=True, rehearsed_error=None)
        return rec
    ctx = ScoreContext(tool=st.tool, arguments=st.arguments or {}, step=st.step,
                       mutates_state=rec["mutates_state"], actual_error=actual_error,
                       rehearsed_error=written_error, history_text=history_text,
                       actual_state_changed=state_changed)
    rec["rehearsed_error"] = (written_error if written_error is not None
                              else is_error_response(rehearsed))
    rec["scores"] = score_fast(rehearsed, actual_text, ctx, settings.scorers)
    rec["diverged"] = settings.verdict(rec["scores"])
    if settings.references:
        rec["references"] = {}
        for name, ref in settings.references.items():
            text = ref(st.tool, st.arguments or {})
            rec["references"][name] = {
                "response": text,
                "scores": score_fast(text, actual_text, ctx, settings.scorers),
            }
    return rec


def trajectory_row(traj: Trajectory, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One line of ``trajectories.jsonl``: per-trajectory fidelity, beside its reward."""
    answered = [r for r in records if not r["unanswered"]]
    first = next((r["step"] for r in answered if r["diverged"]), None)
    mine = [r for r in answered if is_rehearsed(r)]
    first_depth = next((r.get("depth") for r in mine if r["diverged"]), None)
    return {
        "trajectory_id": traj.id,
        "task_id": traj.task_id,
        "source": traj.source,
        "reward": traj.reward,
        "steps": len(records),
        "answered": len(answered),
        "diverged": sum(bool(r["diverged"]) for r in answered),
        "first_divergence": first,
        "rehearsed_steps": len(mine),
        "rehearsed_diverged": sum(bool(r["diverged"]) for r in mine),
        "first_divergence_depth": first_depth,
        "malformed": sum(r["malformed"] is not None for r in records),
        "meta": {k: traj.meta[k] for k in ("train_step", "group", "mode", "plan", "split")
                 if k in traj.meta},
    }
