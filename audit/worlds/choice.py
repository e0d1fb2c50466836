"""A world model that chooses: its own answer or a real training response, by its own likelihood.

    answer = choice_batch(base, scorer, memory, k=3, show=note_fn, tally=tally)
    answer(requests, task_ids)        # one response per request, as any TaskBatchAnswer

The hybrid (`audit.worlds.memory.hybrid_batch`) hands every call the lookup has never seen to the
model, and there the model loses to the lookup's fallback (the tool's most common training response)
more often than it wins: it edits a similar response wrongly where the fixed template was right
(issue #17, `docs/results.md`). Here the model is asked to *rank* instead of only to write. For each
request the candidates are, in this order:

1. the model's own greedy answer (`base`);
2. the tool's most common training response (`ResponseMemory.majority`, the fallback of the
   audit's ``lookup`` reference);
3. the responses of the `k` most similar training calls (`ResponseMemory.similar`);
4. with ``edits=True`` (``envace probe --choose-edits``), the same responses with the asking
   call's differing argument values substituted (`audit.worlds.reference.substitute`: what the
   ``edit`` reference answers with the nearest one; a copy-edit equal to an earlier
   candidate is that candidate, and a win counts under the earlier source);

all from other scenarios than the request's (`audit.worlds.memory.scenario_key`), duplicates (equal
after `audit.scoring.canonical.canonical_text`) dropped, first kept. The `scorer` gives each
candidate the model's log-probability of writing it, whole, after the same prompt the model answered
(`envace.evaluation.model_probe.response_scorer`: the sum over the response's tokens and the closing
`<|im_end|>`, teacher-forced); the highest wins, ties to the earlier candidate, so the model's own
answer wins a tie. A candidate the scorer cannot score (``None``: longer than the generation budget,
so the model could never have written it) is never chosen. The answer is the winning candidate's
text; the model still decides every answer, and the memory only widens what it may say. Only
train-split memories are accepted (`ResponseMemory.from_file`), so no dev or test response can be a
candidate.

`show` (optional) is the transform the model's prompts get, e.g. the memory note
(`audit.worlds.memory.MemoryOptions.wrap`): the scorer ranks under the prompt the model answered.
The `tally` counts which candidate won (``own``, ``majority``, ``similar``, ``edit``; ``unscored``
when no candidate could be scored and the model's answer stands), for the summary's
``world_model.choice`` block.

``own=False`` (``envace probe --choose-among memory``) leaves the model's greedy answer out of
the candidates: the model only ranks real training responses (it still writes the answer where
no real response of the tool can be scored). A model's own greedy answer is close to the mode of
its distribution, so under its own likelihood it tends to win against a real response even where
the real one is right; this variant removes that advantage.

Torch-free: the scorer is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from audit.scoring.canonical import canonical_text
from audit.worlds.reference import substitute
from envace.core.worldmodel import Unanswered

#: (requests, candidates per request) -> a score per candidate (higher: more probable; None:
#: cannot be scored)
CandidateScorer = Callable[[list[Any], list[list[str]]], list[list["float | None"]]]
#: requests, task ids -> the requests the model is shown
Show = Callable[[list[Any], list[str]], list[Any]]

#: requests, task ids -> one answer per request (`audit.worlds.memory.TaskBatchAnswer`)
TaskAnswer = Callable[[list[Any], list[str]], list[Any]]

SOURCES = ("own", "majority", "similar", "edit", "unscored")


def candidates(own: Any, memory: Any, tool: str, arguments: Any, task_id: str | None,
               k: int, edits: bool = False) -> list[tuple[str, str]]:
    """`(source, text)` candidates for one request, duplicates dropped (module doc); `own` is
    left out when the model gave no answer (an `Unanswered`); the similar calls' edits follow
    with `edits`."""
    raw: list[tuple[str, str | None]] = [] if isinstance(own, Unanswered) else [("own", own)]
    raw.append(("majority", memory.majority(tool, task_id)))
    similar = memory.similar(tool, arguments, task_id, k)
    raw += [("similar", e.response) for e in similar]
    if edits and isinstance(arguments, dict):
        raw += [("edit", substitute(e.response, e.arguments, arguments)) for e in similar]
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for source, text in raw:
        if text is None:
            continue
        key = canonical_text(text)
        if key not in seen:
            seen.add(key)
            out.append((source, text))
    return out


def pick(scores: Sequence[float | None]) -> int | None:
    """Index of the highest score, ties to the first; None when nothing could be scored."""
    best: int | None = None
    for i, s in enumerate(scores):
        if s is not None and (best is None or s > scores[best]):  # type: ignore[operator]
            best = i
    return best


def choice_batch(base: Callable[[list[Any]], list[Any]], scorer: CandidateScorer, memory: Any,
                 k: int, show: Show | None = None,
                 tally: dict[str, int] | None = None, own: bool = True,
                 edits: bool = False) -> TaskAnswer:
    """The choosing world model over `base` (module doc), asked with task ids. ``own=False``
    ranks the memory's candidates only (the model's greedy answer is not a candidate; it is
    generated, and answers, only where no memory candidate can be scored)."""

    def answer(requests: list[Any], task_ids: list[str]) -> list[Any]:
        shown = show(requests, task_ids) if show is not None else list(requests)
        mine: list[Any] = base(shown) if own else [Unanswered("not asked")] * len(requests)
        if len(mine) != len(requests):
            raise ValueError(f"world model gave {len(mine)} answers for {len(requests)} requests")
        cands = [candidates(o, memory, r[2], r[3], t, k, edits)
                 for o, r, t in zip(mine, requests, task_ids, strict=True)]
        scores = scorer(shown, [[text for _, text in c] for c in cands])
        out: list[Any] = []
        fallback: list[int] = []
        for i, (o, c, s) in enumerate(zip(mine, cands, scores, strict=True)):
            if len(s) != len(c):
                raise ValueError(f"scorer gave {len(s)} scores for {len(c)} candidates")
            best = pick(s)
            if best is None:  # nothing fits the budget: the model's answer stands
                out.append(o)
                fallback.append(i)
                continue
            source, text = c[best]
            out.append(text)
            if tally is not None:
                tally[source] = tally.get(source, 0) + 1
        if fallback and not own:
            got = base([shown[i] for i in fallback])
            if len(got) != len(fallback):
                raise ValueError(f"world model gave {len(got)} answers for {len(fallback)} "
                                 "requests")
            for i, a in zip(fallback, got, strict=True):
                out[i] = a
        if tally is not None and fallback:
            tally["unscored"] = tally.get("unscored", 0) + len(fallback)
        return out

    return answer
