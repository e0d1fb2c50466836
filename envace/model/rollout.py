"""The episode engine: one policy acts and rehearses, many episodes batched over one KV cache.

    episodes = run_episodes(model, tokenizer, tasks, RolloutConfig(mode="rehearse"))

Per episode (a task of any environment with tasks, ``envace.core.envs.task_envs``: a BFCL
multi-turn or per-turn task, an AgentDojo user task): the prompt (system with the tool listing,
first user turn) is prefilled; the policy writes an assistant message; each call in it is
answered by

- ``rehearse``: the same policy, after a forced ``<|im_start|>tool\\n`` (REHEARSE tokens);
  with ``RolloutConfig.lookup`` (the hybrid world model), the lookup's exact training answer
  is forced in instead wherever it has one (CONTEXT, marked ``rehearsed`` and ``lookup``);
- ``real``: the real environment of the task (``task.env_name``, built by ``make_env``; its text
  is forced in as CONTEXT, kept out of the policy loss, and flagged in ``Episode.real_obs``: the
  tokens ``real_obs_coef``'s supervised loss trains). Each episode's backend runs in a child
  process of its own under the call limits (``RolloutConfig.call_timeout_s`` / ``call_memory_mb``,
  ``envace.core.envs.guard``: C code included); a call past them (or whose process dies) is
  answered with its error text, marked ``timeout`` (or ``crashed``) in the tool message, kept out
  of ``real_obs`` and of the verifier's calls, and ends that episode (``call_timeout`` /
  ``call_crashed``): it costs that episode, never the batch. So does a response past the size
  limit of a response (``MAX_CALL_BYTES``: ``too_large``, ``call_too_large``);
- ``simulator``: a frozen model or an endpoint (forced in as CONTEXT, marked rehearsed);

with ``RolloutConfig.rehearse_trust`` (mode ``rehearse``), a rehearsal whose mean token
log-probability is below it is discarded and the call goes to a real environment of the
episode's own instead (``envace.model.trust``: the confidence gate);

and acting resumes on what came back. An assistant message without calls ends the user turn;
the next user turn is forced in. Limits on turns, tokens per message and context end an episode
cleanly with its reason. A malformed call or an unknown tool is recorded (the audit counts it)
and ends the episode. Output per episode: the trajectory (spec) plus token ids, roles and the
sampling log-probabilities the trainer needs, and the calls per turn for the verifier. The
trajectory's ``env`` names the task's environment (and its benchmark version where it has one).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from envace.core.envs.base import Environment
from envace.core.envs.bfcl.tasks import Task
from envace.core.envs.limits import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_MEMORY_MB,
    CallLimits,
    CallTimeout,
    EnvProcessDied,
)
from envace.core.envs.task_envs import close_env, env_record, task_environment
from envace.core.modes import SOURCE, check_rollout_mode
from envace.core.schema import MAX_CALL_BYTES, Message, Trajectory, utf8_len
from envace.core.timing import NULL_TIMER, Timer
from envace.core.worldmodel import WorldModel
from envace.model import chat
from envace.model.backends.hf import GEN_DTYPES, HFStepper, generation_model, sample
from envace.model.trust import check_trust, confidence, trusts

CONTEXT, ACT, REHEARSE = 0, 1, 2
FORCED_CHUNK = 256  # forced tokens appended per forward and row


@dataclass
class RolloutConfig:
    """Sampling and limits of a rollout."""

    mode: str = "rehearse"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256  # per generated message
    max_turns: int = 30  # assistant messages per episode
    max_context: int = 4096  # tokens per episode
    desc_chars: int = 60  # tool descriptions in the listing are cut to this
    seed: int = 0
    # rehearse with a memory of real responses (`audit.worlds.memory.ResponseMemory`, train split
    # only): before each rehearsed response, a system note of the memory_k most similar calls
    memory: Any = None
    memory_k: int = 3
    # rehearse as the hybrid world model (`audit.worlds.memory.ResponseMemory`, train split only):
    # where the lookup has the exact training answer for a call (never from the task's own
    # scenario), that answer is forced in (CONTEXT, ``rehearsed: true, lookup: true``) instead
    # of the policy writing it; elsewhere the policy rehearses as usual
    lookup: Any = None
    # the dtype the transformers backend decodes in (`backends.hf.generation_model`): "same"
    # (the model's own) or "bfloat16" (a copy, refreshed when the weights change)
    gen_dtype: str = "same"
    # the transformers backend's linear layers run on weights packed once for oneDNN
    # (`backends.packed_linear`; CPU fp32/bf16, same product in another summation order);
    # False: plain F.linear, which repacks every weight at every call
    packed_linear: bool = True
    # mode ``real``: every environment call's wall-clock limit (s) and added memory (MiB), each
    # None for no limit (both None: the backend in this process, no child); envace.core.envs.guard
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S
    call_memory_mb: int | None = DEFAULT_MEMORY_MB
    # mode ``rehearse``: the confidence gate (``envace.model.trust``): a rehearsal with mean
    # token log-prob below this is replaced by the real environment's response; None: off
    rehearse_trust: float | None = None

    @property
    def call_limits(self) -> CallLimits:
        return CallLimits(self.call_timeout_s, self.call_memory_mb)

    def __post_init__(self) -> None:
        check_rollout_mode(self.mode)  # envace.core.modes
        self.rehearse_trust = check_trust(self.rehearse_trust)
        if self.gen_dtype not in GEN_DTYPES:
            raise ValueError(f"gen_dtype={self.gen_dtype!r}: one of {', '.join(GEN_DTYPES)}")


@dataclass
class Episode:
    """One finished episode."""

    task: Task
    trajectory: Trajectory
    ids: list[int]
    roles: list[int]
    logprobs: list[float]  # sampling log-prob of generated tokens, 0 for context
    step_of_token: list[int]  # tool-call step a REHEARSE token answers, else -1
    prompt_len: int
    end_reason: str
    calls_per_turn: list[list[tuple[str, dict[str, Any]]]]
    # True on the tokens the real environment wrote (each real tool response's text and its
    # <|im_end|>: what the rehearse role would write), all CONTEXT in ``roles``; empty: none
    real_obs: list[bool] = field(default_factory=list)

    def tokens(self, role: int) -> int:
        return sum(r == role for r in self.roles)

    @property
    def final_text(self) -> str:
        """The last assistant message's text (what AgentDojo's checkers read as the answer)."""
        for m in reversed(self.trajectory.messages):
            if m.role == "assistant":
                return m.content or ""
        return ""


@dataclass
class _Row:
    task: Task
    env: Environment | None
    messages: list[dict[str, Any]]
    ids: list[int]
    roles: list[int]
    logprobs: list[float]
    step_of_token: list[int]
    calls_per_turn: list[list[tuple[str, dict[str, Any]]]]
    queue: deque = field(default_factory=deque)  # forced (token, role, step)
    gen: str | None = "act"  # what to generate once the queue is empty
    buf: list[int] = field(default_factory=list)
    buf_logp: float = 0.0
    pending: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    turn: int = 0
    steps: int = 0
    assistant_messages: int = 0
    done: str | None = None
    real_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of real text
    reh_start: int = 0  # where the rehearsal being written starts (its tool header)
    # tokens of a gated rehearsal that the decoding cache holds and must forget (run_episodes)
    rollback: int = 0

    def push(self, tok: int, role: int, logprob: float, step: int) -> None:
        """Record one token of the episode (forced or sampled)."""
        self.ids.append(tok)
        self.roles.append(role)
        self.logprobs.append(logprob)
        self.step_of_token.append(step)


class Engine:
    """Holds the tokenizer-level pieces of the format (marker ids, forced texts)."""

    def __init__(self, model: Any, tokenizer: Any, cfg: RolloutConfig,
                 simulator: WorldModel | None = None) -> None:
        if cfg.mode == "simulator" and simulator is None:
            raise ValueError("mode 'simulator' needs a simulator (a frozen model or an endpoint)")
        self.model, self.tok, self.cfg, self.simulator = model, tokenizer, cfg, simulator
        self.im_start = chat.marker_id(tokenizer, chat.IM_START)
        self.im_end = chat.marker_id(tokenizer, chat.IM_END)
        self.nl = chat.encode_text(tokenizer, "\n")
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else self.im_end

    # -- forced text ------------------------------------------------------------------------
    def _header(self, role: str) -> list[int]:
        return [self.im_start, *chat.encode_text(self.tok, f"{role}\n")]

    def _force(self, row: _Row, ids: Sequence[int], role: int = CONTEXT, step: int = -1) -> None:
        row.queue.extend((t, role, step) for t in ids)

    def _force_turn(self, row: _Row, role: str, text: str) -> tuple[int, int]:
        """Queue a whole turn; returns where its text and ``<|im_end|>`` will land in the
        episode, ``[start, end)`` (the queue is pushed in order)."""
        header, body = self._header(role), chat.encode_text(self.tok, text)
        start = len(row.ids) + len(row.queue) + len(header)
        self._force(row, [*header, *body, self.im_end, *self.nl])
        return start, start + len(body) + 1

    # -- episode logic ----------------------------------------------------------------------
    def start(self, task: Task) -> _Row:
        env, failed = None, None
        if self.cfg.mode == "real":
            try:  # a reset past the limits (a per-turn task replays its history): one episode
                env = task_environment(task, self.cfg.call_limits)
            except CallTimeout:
                failed = "reset_timeout"
            except EnvProcessDied:
                failed = "reset_crashed"
        messages = task.opening_messages()
        ids, _ = chat.encode_with_roles(self.tok, messages, task.tools(turn=0),
                                            generation_prompt="assistant",
                                            desc_chars=self.cfg.desc_chars)
        n = len(ids)  # the prompt (incl. earlier turns of a per-turn task) is never trained
        row = _Row(task, env, [dict(m) for m in messages], ids, [CONTEXT] * n, [0.0] * n,
                   [-1] * n, [[] for _ in task.turns])
        # call ids (and step indices) continue after the calls of earlier turns in the history
        row.steps = sum(len(m.get("tool_calls") or []) for m in messages)
        row.done = failed
        return row

    def _offered(self, row: _Row) -> set[str]:
        return {s["function"]["name"] for s in row.task.tools(turn=row.turn)}

    def finish_message(self, row: _Row) -> None:
        text = self.tok.decode(row.buf, skip_special_tokens=False)
        text = text.split(chat.IM_END, 1)[0]
        kind, logp, ntok = row.gen, row.buf_logp, len(row.buf)
        row.buf, row.buf_logp, row.gen = [], 0.0, None
        self._force(row, self.nl)
        if kind == "rehearse":
            if self.cfg.rehearse_trust is not None and not trusts(logp, ntok,
                                                                   self.cfg.rehearse_trust):
                self._gate(row, confidence(logp, ntok))
                return
            call_id, name, _ = row.pending.pop(0)
            row.messages.append({"role": "tool", "tool_call_id": call_id, "name": name,
                                 "content": text, "rehearsed": True, "logprob": logp,
                                 "num_tokens": ntok})
            self._next_response(row)
            return
        row.assistant_messages += 1
        parsed = chat.parse_assistant(text)
        msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        calls = []
        for c in sorted([*parsed.calls, *parsed.malformed], key=lambda c: c.index):
            call_id = f"c{row.steps}"
            row.steps += 1
            if isinstance(c, chat.ParsedCall):
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}})
                row.pending.append((call_id, c.name, c.arguments))
                row.calls_per_turn[row.turn].append((c.name, c.arguments))
            else:  # kept as a malformed call: arguments as a string that is not a JSON object
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": c.name or "", "arguments": c.raw}})
        if calls:
            msg["tool_calls"] = calls
        msg["logprob"], msg["num_tokens"] = logp, ntok
        row.messages.append(msg)
        unknown = [n for _, n, _ in row.pending if n not in self._offered(row)]
        if parsed.malformed:
            row.done = "malformed_call"
        elif unknown:
            row.done = f"unknown_tool:{unknown[0][:60]}"
        elif row.assistant_messages >= self.cfg.max_turns:
            row.done = "max_turns"
        elif row.pending:
            self._next_response(row)
        else:
            self._next_user_turn(row)

    def _next_response(self, row: _Row) -> None:
        if not row.pending:
            self._force(row, self._header("assistant"))
            row.gen = "act"
            return
        call_id, name, args = row.pending[0]
        step = int(call_id[1:])
        known = (self.cfg.lookup.exact(name, args, row.task.id, row.messages)
                 if self.cfg.mode == "rehearse" and self.cfg.lookup is not None else None)
        if self.cfg.mode == "rehearse" and known is None:
            self._memory_note(row, name, args)
            row.reh_start = len(row.ids) + len(row.queue)
            self._force(row, self._header("tool"))
            row.gen = "rehearse"
            row.current_step = step  # type: ignore[attr-defined]
            return
        if self.cfg.mode == "real" and known is None:
            self._answer_real(row, call_id, name, args)
            return
        if known is not None:  # the hybrid: the lookup's training answer, forced in
            content, extra = known, {"lookup": True}
        else:
            content = self.simulator(row.messages, row.task.tools(), name, args)  # type: ignore[misc]
            extra = {}
        row.pending.pop(0)
        row.messages.append({"role": "tool", "tool_call_id": call_id, "name": name,
                             "content": content, "rehearsed": True, **extra})
        self._force_turn(row, "tool", content)
        self._next_response(row)

    def _answer_real(self, row: _Row, call_id: str, name: str, args: dict[str, Any],
                     mark: dict[str, Any] | None = None) -> None:
        """The real environment answers the pending call (``mark``: extra fields of the tool
        message, the gate's); a call past the limits ends the episode (``_end_on``)."""
        res = row.env.execute(name, args)  # type: ignore[union-attr]
        content = res.content
        extra = {**({"error": True} if res.error else {}), **(mark or {})}
        ended = _ended(res)
        if not ended and len(content) > MAX_CALL_BYTES // 4 and (
                size := utf8_len(content)) > MAX_CALL_BYTES:  # the audit's own limit
            content = (f"Error during execution: the response of {size} bytes passes the "
                       f"{MAX_CALL_BYTES}-byte limit of a response (docs/audit.md, size "
                       "limits)")
            ended = "too_large"
        if ended:  # no real response: answered with why, and the episode ends on it
            self._end_on(row, call_id, name, args, content, ended, mark)
            return
        row.pending.pop(0)
        row.messages.append({"role": "tool", "tool_call_id": call_id, "name": name,
                             "content": content, "rehearsed": False, **extra})
        row.real_spans.append(self._force_turn(row, "tool", content))
        self._next_response(row)

    def _gate(self, row: _Row, conf: float) -> None:
        """The rehearsal just written is not trusted: its tokens (tool header, text, end marker)
        leave the episode, the decoding cache forgets the ones it holds (all but the end marker,
        ``rollback``), and the episode's own real environment (built now, on its first gated
        call) answers the call instead."""
        row.queue.clear()  # only the newline after the discarded message was queued
        drop = len(row.ids) - row.reh_start
        row.rollback = drop - 1
        for seq in (row.ids, row.roles, row.logprobs, row.step_of_token):
            del seq[row.reh_start:]
        if row.env is None:
            try:
                row.env = task_environment(row.task, self.cfg.call_limits)
            except CallTimeout:
                row.done = "reset_timeout"
                return
            except EnvProcessDied:
                row.done = "reset_crashed"
                return
        call_id, name, args = row.pending[0]
        self._answer_real(row, call_id, name, args,
                          {"gated": True, "rehearsal_confidence": conf})

    def _end_on(self, row: _Row, call_id: str, name: str, args: dict[str, Any], content: str,
                how: str, mark: dict[str, Any] | None = None) -> None:
        """A call cut at the limit (``timeout``), whose process died (``crashed``) or whose
        response passes the size limit (``too_large``): its error text is the tool message (so
        marked), forced in as CONTEXT but not as a real observation; the call leaves the
        verifier's list (the guard takes a cut call to have changed nothing, and running it
        again would only stall again); the episode ends."""
        row.pending.pop(0)
        row.messages.append({"role": "tool", "tool_call_id": call_id, "name": name,
                             "content": content, "rehearsed": False, "error": True, how: True,
                             **(mark or {})})
        turn_calls = row.calls_per_turn[row.turn]
        for k in range(len(turn_calls) - 1, -1, -1):
            if turn_calls[k] == (name, args):
                del turn_calls[k]
                break
        self._force_turn(row, "tool", content)
        row.done = f"call_{how}"

    def _memory_note(self, row: _Row, name: str, args: dict[str, Any]) -> None:
        """With a memory: the note of similar training calls (never the task's own scenario) as
        a system turn before the rehearsed response, as `envace probe --memory` shows it; it
        stays in the episode (CONTEXT, recorded as a system message with ``memory: true``)."""
        if self.cfg.memory is None or self.cfg.memory_k <= 0:
            return
        # lazy: loads numpy, rapidfuzz: only this path needs it
        from audit.worlds.memory import render_note

        note = render_note(self.cfg.memory.similar(name, args, row.task.id, self.cfg.memory_k))
        if note:
            row.messages.append({"role": "system", "content": note, "memory": True})
            self._force_turn(row, "system", note)

    def _next_user_turn(self, row: _Row) -> None:
        row.turn += 1
        if row.turn >= len(row.task.turns):
            row.done = "finished"
            return
        for m in row.task.turn_messages(row.turn):
            row.messages.append(m)
            self._force_turn(row, m["role"], m["content"])
        self._force(row, self._header("assistant"))
        row.gen = "act"

    def start_all(self, tasks: Sequence[Task]) -> tuple[list[_Row], list[int]]:
        """Rows for the tasks and their prompt lengths; a prompt over the context limit ends
        its episode before it starts."""
        rows: list[_Row] = []
        try:
            for t in tasks:
                rows.append(self.start(t))
        except BaseException:
            close_rows(rows)
            raise
        for r in rows:
            if len(r.ids) >= self.cfg.max_context:
                r.done = "context_limit"
        return rows, [len(r.ids) for r in rows]

    def episode(self, row: _Row, prompt_len: int) -> Episode:
        traj = Trajectory(
            id=f"{row.task.id}", task_id=row.task.id,
            env=env_record(row.task),
            source=SOURCE[self.cfg.mode],
            messages=[Message.model_validate(m) for m in row.messages],
            tools=row.task.tools(),
            meta={"mode": self.cfg.mode, "end_reason": row.done, "base_task": row.task.base_id,
                  "temperature": self.cfg.temperature, "top_p": self.cfg.top_p},
        )
        real_obs = [False] * len(row.ids) if row.real_spans else []
        for start, end in row.real_spans:  # an episode cut short keeps what it pushed
            real_obs[start:min(end, len(row.ids))] = [True] * (min(end, len(row.ids)) - start)
        return Episode(row.task, traj, row.ids, row.roles, row.logprobs, row.step_of_token,
                       prompt_len, row.done or "unknown", row.calls_per_turn, real_obs)


def _ended(res: Any) -> str | None:
    """``"timeout"`` or ``"crashed"`` when a real call gave no response of its own."""
    if getattr(res, "crashed", False):
        return "crashed"
    return "timeout" if getattr(res, "timeout", False) else None


def close_rows(rows: Sequence[_Row]) -> None:
    """End the episodes' environment processes (mode ``real``)."""
    for r in rows:
        if r.env is not None:
            close_env(r.env)
            r.env = None


def push_token(eng: Engine, r: _Row, tok: int, lp: float, cfg: RolloutConfig,
               tokenizer: Any) -> bool:
    """Append one token to a row: its next forced token if it has forced text queued, else the
    sampled ``tok`` (ending the message on ``<|im_end|>`` or at the token cap). True when a
    message or the episode ended. Shared by ``run_episodes``, the message-level backends
    (``envace.model.backends.base``) and the engine benchmark."""
    if r.queue:
        tok, role, step = r.queue.popleft()
        lp = 0.0
    else:
        role = ACT if r.gen == "act" else REHEARSE
        step = getattr(r, "current_step", -1) if role == REHEARSE else -1
        r.buf.append(tok)
        r.buf_logp += lp
    r.push(tok, role, lp, step)
    ended = False
    if role != CONTEXT and tok == eng.im_end:
        eng.finish_message(r)
        ended = True
    elif role != CONTEXT and len(r.buf) >= cfg.max_new_tokens:
        r.done = "max_new_tokens"
        r.messages.append({"role": "assistant" if r.gen == "act" else "tool",
                           "content": tokenizer.decode(r.buf), "truncated": True,
                           **({} if r.gen == "act" else {
                               "tool_call_id": r.pending[0][0], "name": r.pending[0][1],
                               "rehearsed": True})})
        ended = True
    if r.done is None and len(r.ids) + len(r.queue) >= cfg.max_context:
        r.done = "context_limit"
    return ended or r.done is not None


def choose_logits(all_logits: Sequence[torch.Tensor], rehearsing: Sequence[bool]
                  ) -> torch.Tensor:
    """The next-token logits ``[rows, V]`` each live row samples from: with a world model
    (``all_logits`` = [policy's, world model's]) the world model's for the rows that rehearse
    next, the policy's for the others. The row mask is made on the logits' device."""
    if len(all_logits) == 1:
        return all_logits[0]
    use_wm = torch.tensor(list(rehearsing), dtype=torch.bool, device=all_logits[0].device)
    return torch.where(use_wm[:, None], all_logits[1], all_logits[0])


@torch.no_grad()
def run_episodes(model: Any, tokenizer: Any, tasks: Sequence[Task], cfg: RolloutConfig,
                 simulator: WorldModel | None = None,
                 world_model: Any | None = None, timer: Timer = NULL_TIMER) -> list[Episode]:
    """Run one episode per task, all batched together; returns them in task order.

    ``world_model`` (the paper's unshared ablation, mode ``split``): a second model with the same
    tokenizer that reads every token too and writes the tool responses; ``model`` only acts.
    ``timer`` sections: ``rollout/prefill`` (the prompts), ``rollout/decode`` (sampling, and
    the forwards in which every row appends one sampled token), ``rollout/forced`` (the forwards
    in which some row appends forced text: headers, real or simulated responses, user turns);
    what is left (parsing, answers of the environment or simulator, bookkeeping) is the
    caller's section.
    """
    eng = Engine(model, tokenizer, cfg, simulator)
    rows, prompt_lens = eng.start_all(tasks)
    try:  # every episode's environment process ends with the rollout, however it ends
        gen = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed)
        models = [model] + ([world_model] if world_model is not None else [])
        was_training = [m.training for m in models]
        for m in models:
            m.eval()
        steppers = [HFStepper(generation_model(m, cfg.gen_dtype), eng.pad, packed=cfg.packed_linear)
                    for m in models]
        # the batch holds only live rows (``live``: their indices); a row over the context limit is
        # never encoded, a finished row leaves the batch
        live = [i for i, r in enumerate(rows) if r.done is None]
        with timer.section("rollout/prefill"):
            all_logits = [s.prefill([rows[i].ids for i in live]) for s in steppers] if live else []
        while live:
            with timer.section("rollout/decode"):
                logits = choose_logits(all_logits, [not rows[i].queue and rows[i].gen == "rehearse"
                                                    for i in live])
                toks, logps = sample(logits, cfg.temperature, cfg.top_p, gen)
            chunks: list[list[int]] = []
            forced = False
            for j, i in enumerate(live):
                r = rows[i]
                if r.queue:  # forced text goes in as one chunk (one forward, not one per token)
                    forced = True
                    chunk = [r.queue.popleft() for _ in range(min(FORCED_CHUNK, len(r.queue)))]
                    chunks.append([t for t, _, _ in chunk])
                    for t, role, step in chunk:
                        r.push(t, role, 0.0, step)
                else:  # a sampled token: recorded, and the message ends on <|im_end|> or the cap
                    push_token(eng, r, int(toks[j]), float(logps[j]), cfg, tokenizer)
                    if r.rollback:  # a gated rehearsal: the cache forgets it, nothing appended
                        for s in steppers:
                            s.forget(j, r.rollback)
                        r.rollback = 0
                        chunks.append([])
                    else:
                        chunks.append([r.ids[-1]])
                if r.done is None and len(r.ids) + len(r.queue) >= cfg.max_context:
                    r.done = "context_limit"
            keep = [j for j, i in enumerate(live) if rows[i].done is None]
            if len(keep) < len(live):  # what a finished row would append is never needed
                live, chunks = [live[j] for j in keep], [chunks[j] for j in keep]
                if not live:
                    break
                for s in steppers:
                    s.select(keep)
            with timer.section("rollout/forced" if forced else "rollout/decode"):
                all_logits = [s.extend(chunks) for s in steppers]
        for m, flag in zip(models, was_training, strict=True):
            m.train(flag)
        return [eng.episode(r, n) for r, n in zip(rows, prompt_lens, strict=True)]
    finally:
        close_rows(rows)
