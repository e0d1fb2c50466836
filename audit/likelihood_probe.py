"""The likelihood audit: how probable each real tool response is under a world model.

    summary = run_likelihood_probe(["dev.jsonl"], "lk_out", score_batch, opts, label="PATH")

The real environment replays every trajectory as the teacher-forced probe does (``audit.probe``:
same reset, same calls in order, same step rows), but the world model writes nothing: once a
trajectory's real responses are known, the model scores them all, each given the real history
before it (``score_batch``: a local model's one forward per trajectory,
``envace.evaluation.likelihood``; a served one's prompt log-probabilities,
``envace.evaluation.endpoint_likelihood``). Each step row gains ``likelihood`` (``nats``,
``tokens``, ``bytes``, ``bits_per_byte``, and with ``opts.reference`` ``compressor_bits``,
``audit.worlds.compressor``); a step the model could not score has ``likelihood_skipped`` (why)
instead. Nothing is generated, so rows are unanswered (``rehearsed: null``,
``unanswered_reason`` says it was a likelihood audit) and the divergence statistics are empty;
the summary's ``likelihood`` block (``audit.stats.likelihood``) holds the figures, ``probe`` is
``"likelihood"``. This module never imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from audit.probe import CHUNK, TrajectoryAudit, run_probe
from audit.scoring.settings import AuditOptions
from audit.stats.likelihood import KEY, NOT_SCORED, likelihood_entry
from envace.core.schema import Trajectory
from envace.core.worldmodel import Unanswered

PROBE = "likelihood"
REASON = "likelihood audit: the model scored the real response and wrote none"


@dataclass(frozen=True)
class Scoring:
    """One trajectory to score: the real conversation (every answered call's tool message holding
    the real, replayed response, marked ``rehearsed: false``), its tool schemas, and for each
    step to score the index of its tool message in ``messages``."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    targets: dict[int, int]


#: per trajectory, per step: ``(nats, tokens)`` (tokens counting the end marker), or why not
Scores = dict[int, "tuple[float, int] | str"]
ScoreBatch = Callable[[list[Scoring]], list[Scores]]


def scoring_of(traj: Trajectory, records: Sequence[dict[str, Any]]) -> Scoring:
    """The real conversation of ``traj`` with each recorded response replaced by the real one
    (``records``' ``actual``), and the message index of every step to score."""
    actual = {int(r["step"]): r for r in records}
    where = {id(st.response): st.step for st in traj.tool_steps() if st.response is not None}
    messages: list[dict[str, Any]] = []
    targets: dict[int, int] = {}
    for i, m in enumerate(traj.messages):
        d = m.dump()
        step = where.get(id(m))
        if step is not None and step in actual:
            d.update(content=str(actual[step]["actual"]), rehearsed=False)
            for k in ("logprob", "num_tokens", "error", "lookup"):
                d.pop(k, None)
            targets[step] = i
        messages.append(d)
    return Scoring(messages, traj.tools, targets)


def _nothing(*_request: Any) -> str:
    """The world model of a likelihood audit: it writes nothing."""
    raise Unanswered(REASON)


def annotator(score_batch: ScoreBatch, reference: Any = None,
              rows: list[dict[str, Any]] | None = None
              ) -> Callable[[list[Trajectory], list[TrajectoryAudit | Exception]], None]:
    """The ``annotate`` hook of ``audit.probe.run_probe``: scores a chunk's trajectories with
    ``score_batch`` and writes ``likelihood`` (or ``likelihood_skipped``) into their records;
    ``reference`` (a ``CompressorReference``) adds ``compressor_bits``."""

    def annotate(trajs: list[Trajectory], results: list[TrajectoryAudit | Exception]) -> None:
        todo = [(t, r) for t, r in zip(trajs, results, strict=True)
                if isinstance(r, TrajectoryAudit)]
        scorings = [scoring_of(t, r.steps) for t, r in todo]
        got = score_batch(scorings) if scorings else []
        if len(got) != len(scorings):
            raise ValueError(f"score_batch gave {len(got)} results for {len(scorings)}")
        for (_t, res), sc, per in zip(todo, scorings, got, strict=True):
            for rec in res.steps:
                rec["probe"] = PROBE
                step = int(rec["step"])
                value = per.get(step) if step in sc.targets else \
                    "no tool message for this call in the trajectory"
                if isinstance(value, tuple):
                    nats, tokens = value
                    bits = (None if reference is None
                            else reference.bits(str(rec["tool"]), str(rec["actual"])))
                    rec[KEY] = likelihood_entry(nats, tokens, str(rec["actual"]), bits)
                else:
                    rec[NOT_SCORED] = str(value or "not scored")
                if rows is not None:
                    rows.append(rec)

    return annotate


def run_likelihood_probe(
    paths: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    score_batch: ScoreBatch,
    opts: AuditOptions | None = None,
    limit: int = 0,
    label: str | None = None,
    extra: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    chunk: int = CHUNK,
) -> dict[str, Any]:
    """The likelihood audit of `paths` into `out_dir` (an audit directory like every probe's);
    the summary, with ``probe: "likelihood"`` and the ``likelihood`` block (built by
    ``audit.stats.summary`` from the rows). With ``opts.reference`` (a train-split file) every
    scored step also gets the primed compressor's code length. ``extra``: summary fields (the
    scorer's ``likelihood_scorer`` block: what it ran, its context and passes)."""
    # lazy: loads the reference world models (numpy, rapidfuzz), needed only with --reference
    from audit.pipeline import reference_triples
    from audit.worlds.compressor import CompressorReference

    opts = opts or AuditOptions()
    reference = (CompressorReference.from_triples(reference_triples(opts.reference))
                 if opts.reference else None)

    def more() -> dict[str, Any]:
        out: dict[str, Any] = {"probe": PROBE}
        out.update((extra() if callable(extra) else extra) or {})
        return out

    # one trajectory at a time through one environment per family (`rehearser`, not rounds of
    # `answer_batch`, which keep a live environment, a forked child, per trajectory of a chunk)
    return run_probe(paths, out_dir, _nothing, opts, limit, label=label, extra=more,
                     chunk=chunk, annotate=annotator(score_batch, reference))
