"""The probe's continuous feed: trajectories join a streaming world model as others end.

    stream_probe(items, start, answer_batch.stream, steps, histories, live, emit)

A streaming answerer (the kept-cache path, `envace.evaluation.model_probe.kept_answers`) answers
each trajectory's next request as soon as its previous answer ends. Asked chunk by chunk, every
chunk would still end on a tail of few rows while its last trajectories finish, once per
history. Here the trajectories of every history share one stream with at most ``live``
conversations at once (each holds a KV cache: ``live`` bounds memory as the chunk did); when
one ends, the next readable record's probes start in its place (``more``). Each record's
result is handed to ``emit`` in input order as soon as it and every record before it are done,
so rows are written as they finish, as the chunked probe writes them. The audits are the
probe's own (``start`` is `audit.probe.probe_steps` bound to the run's settings): a trajectory's
requests and answers do not depend on which others share the stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

Key = tuple[str, int]  # (history, the record's place in the input)


def stream_probe(items: Iterator[Any], start: Callable[[Any, Any, str], Generator[Any, Any, Any]],
                 stream: Callable[..., None], steps: Mapping[str, Any] | None,
                 histories: Sequence[str], live: int,
                 emit: Callable[[Any, list[Any] | None], None]) -> None:
    """Probe every record of ``items`` (each with ``.trajectory``: None when unreadable) for
    each of ``histories`` through ``stream(first, answered, more)``: ``start(trajectory,
    wanted_steps, history)`` is a trajectory's probe generator (it yields requests, is sent the
    answers and returns the audit); ``emit(item, results)`` in input order: per history the
    trajectory's audit or the exception that stopped it (None for an unreadable record)."""
    places = itertools.count()
    order: dict[int, tuple[Any, dict[str, Any]]] = {}  # place -> (item, results by history)
    gens: dict[Key, Any] = {}  # live conversations: their probe generators
    head = [0]  # the first place not yet emitted
    source = iter(items)
    ended = [False]

    def flush() -> None:
        while head[0] in order:
            item, res = order[head[0]]
            if item.trajectory is not None and len(res) < len(histories):
                return
            del order[head[0]]
            head[0] += 1
            emit(item, None if item.trajectory is None else [res[h] for h in histories])

    def finish(key: Key, result: Any) -> None:
        gens.pop(key, None)
        order[key[1]][1][key[0]] = result

    def step(key: Key, gen: Any, reply: Any = None, first: bool = False) -> Any:
        try:
            request = next(gen) if first else gen.send(reply)
        except StopIteration as stop:
            finish(key, stop.value)
            return None
        except Exception as exc:  # noqa: BLE001 - one trajectory's failure is its result
            finish(key, exc)
            return None
        gens[key] = gen
        return request

    def more() -> list[tuple[Key, Any]]:
        """The first requests of the records that start now: while there is room, or while
        nothing is live at all (a record whose probes all ended at once takes no room)."""
        new: list[tuple[Key, Any]] = []
        while not ended[0] and (len(gens) + len(histories) <= live or not gens):
            item = next(source, None)
            if item is None:
                ended[0] = True
                break
            place = next(places)
            order[place] = (item, {})
            traj = item.trajectory
            if traj is None:
                continue
            wanted = None if steps is None else steps.get(traj.id, ())
            for h in histories:
                key = (h, place)
                request = step(key, start(traj, wanted, h), first=True)
                if request is not None:
                    new.append((key, request))
        flush()
        return new

    def answered(key: Key, reply: str) -> Any:
        request = step(key, gens[key], reply)
        if request is None:
            flush()
        return request

    first = more()
    if first:
        stream(first, answered, more)
    if gens or not ended[0] or order:
        raise RuntimeError("the stream ended with trajectories still being probed")
