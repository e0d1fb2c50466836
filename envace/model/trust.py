"""The confidence gate of rehearsal: rehearse where the policy is confident, ask reality elsewhere.

    check_trust(-0.5)                    # the threshold C, validated (a finite float <= 0)
    trusts(logprob, num_tokens, -0.5)    # keep this rehearsal?
    gate_counts(trajectory.messages)     # {"rehearsed": ..., "gated_real": ...}

A rehearsed response's confidence is the mean token log-probability the policy wrote it with
(``audit.stats.confidence.mean_token_logprob``: ``logprob / num_tokens`` over its tokens and the
closing end marker, under the rollout's sampling temperature), the measure the audit's
``confidence`` block and its risk–coverage curve use. With a threshold C
(``RolloutConfig.rehearse_trust``; ``envace eval --trust-above C``; ``envace train
rehearse_trust=C``) a rehearsal is *trusted* when its confidence >= C. An untrusted one is
discarded (its tokens leave the episode as if never written) and the call goes to a real
environment of the episode's own (built on the first such call): the tool message is then the
real response, ``rehearsed: false``, with ``gated: true`` and ``rehearsal_confidence`` (the
discarded rehearsal's confidence). That environment executes only the calls sent to it, never
the rehearsed ones before them, so where an earlier rehearsed call would have changed state its
answer reflects a state without that change (docs/spec/trajectory.md).

C is a log-probability, so <= 0: C = 0 sends every call to reality except a rehearsal whose
every token had probability 1 (in floating point); a very low C (-1e9) keeps every rehearsal,
which is plain rehearsal. NaN, infinities and C > 0 are refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from audit.stats.confidence import mean_token_logprob


def check_trust(c: Any) -> float | None:
    """The threshold as a float (None: no gate); a clear ValueError unless it is a finite
    number <= 0 (a mean token log-probability is never above 0)."""
    if c is None:
        return None
    if isinstance(c, bool) or not isinstance(c, int | float):
        raise ValueError(f"trust threshold {c!r}: a number (a mean token log-probability, <= 0)")
    if not math.isfinite(c) or c > 0:
        raise ValueError(f"trust threshold {c}: a finite number <= 0 (a mean token "
                         "log-probability; 0 sends nearly every call to reality, -1e9 none)")
    return float(c)


def confidence(logprob: float, num_tokens: int) -> float:
    """The rehearsal's mean token log-probability; -inf when it has no usable figures (so an
    unscorable rehearsal is never trusted)."""
    m = mean_token_logprob(logprob, num_tokens)
    return -math.inf if m is None else m


def trusts(logprob: float, num_tokens: int, c: float) -> bool:
    """Whether a rehearsal written with these figures is kept under threshold ``c``."""
    return confidence(logprob, num_tokens) >= c


def gate_counts(messages: Iterable[Any]) -> dict[str, int]:
    """Tool messages of one episode: ``rehearsed`` (written by the policy or a simulator, lookups
    included) and ``gated_real`` (sent to reality by the gate). Messages as dicts or as
    ``envace.core.schema.Message``."""
    out = {"rehearsed": 0, "gated_real": 0}
    for m in messages:
        get = m.get if isinstance(m, dict) else (lambda k, m=m: getattr(m, k, None))
        if get("role") != "tool":
            continue
        if get("gated") is True:
            out["gated_real"] += 1
        elif get("rehearsed") is True:
            out["rehearsed"] += 1
    return out
