"""Benchmark: rehearsal-rollout throughput of our engine against a plain tool loop that re-encodes.

    .venv/bin/python -m bench.rollout_engine                 # tiny + smollm2, ~5 min when quiet
    .venv/bin/python -m bench.rollout_engine --only tiny --tasks 2 --max-turns 4   # smoke
    .venv/bin/python -m bench.rollout_engine --only smollm2 --tasks 8 --gen-dtype same bfloat16 \
        --no-reencode --name rollout_engine_bf16    # fp32 against the bf16 copy, same tasks
    .venv/bin/python -m bench.rollout_engine --only smollm2 tiny --tasks 8 --kernels plain \
        packed --compact-below 0 0.75 --repeats 3 --no-reencode --name rollout_engine_packed

Dev tasks with >= 6 ground-truth calls, mode ``rehearse``, one batch, same model, greedy decoding
(temperature 0: both sides follow the same token path; identical episodes are counted). ``ours``:
``envace.model.rollout.run_episodes`` (lockstep batch over one kept KV cache). ``reencode``: a plain
tool loop over the same episode logic (``Engine``: same parser, stop rule, limits) that, for every
message, encodes the whole sequence so far of each live episode from scratch (fresh cache, same
``HFStepper`` kernels and threads), decodes the message and waits for the batch's longest one.

Guidance: no preset acts well enough yet for long episodes (the cold-started tiny mostly emits a
malformed call and stops; zero-shot SmolLM2 answers in prose), so ``Probe`` masks the logits to
steer greedy decoding along each task's real trajectory: the forward pass is the model's own,
only the winning token is scripted. ``act`` steers assistant messages, the model rehearses freely
(tiny: the cold start of ``envace sft --preset tiny``, cached as ``<cache>/bench-sft-tiny`` as
``experiments.presets`` does, trained if missing); ``all`` also steers tool responses to the real
ones (smollm2: zero-shot unless ``<cache>/bench-sft-smollm2`` exists). Ceiling: copy bandwidth (read
+ write bytes of a 256 MiB ``copy_``, best of 5, on the decode thread count) / parameter bytes per
decode step = decode steps/s, against ours (one-token forwards only, and end to end). A decode step
also reads every row's whole (padded) KV cache: ``kv_bytes_per_decode_step`` is its mean over the
run's one-token steps (``kv_real_share``: the share of those positions that hold a real token, not
padding), and ``ratio_forward_with_kv`` the ratio against a ceiling that counts weights and cache.
With ``--gen-dtype bfloat16`` the rollout decodes with the model's bf16 copy (``rollout_dtype``,
``envace.model.backends.hf.generation_model``): the ceiling then counts the bf16 bytes it reads, and
``ratio_forward_fp32_bytes`` the fp32 bytes the same model has; several dtypes run in turn on the
same tasks. ``--kernels packed plain`` runs the linear layers on oneDNN-packed weights (the default,
``envace.model.backends.packed_linear``) and on plain ``F.linear`` in turn; ``ratios`` holds each
variant's speed over the first one run; ``--compact-below 0.75 0`` likewise with and without
dropping the cache's padding (``envace.model.backends.kv_cache.compact``). ``--repeats R`` runs all
variants R times, interleaved (this shared machine's speed moves from minute to minute): a variant's
row is its median repeat and ``ratios`` the median of the per-repeat ratios, each repeat's kept
beside it. Writes bench/results/rollout_engine.json (``quiet_machine``: 1-min load average < 1.5)
and a table. """

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

import envace.model.backends.hf as hf
from bench.machine import table, write_result
from envace.core.envs.bfcl.export import real_trajectory
from envace.core.envs.bfcl.tasks import split_tasks
from envace.model import chat
from envace.model.backends.hf import CACHE_KW, GEN_DTYPES, HFStepper, generation_model, sample
from envace.model.models import default_cache_dir, load_model, read_marker, resolve_model
from envace.model.rollout import (
    ACT,
    REHEARSE,
    Engine,
    Episode,
    RolloutConfig,
    push_token,
    run_episodes,
)

# max_new_tokens caps every message; the real messages of these tasks need up to 73 tokens.
PLAN = {"tiny": {"tasks": 8, "max_new_tokens": 96, "max_turns": 30, "guide": "act"},
        "smollm2": {"tasks": 2, "max_new_tokens": 96, "max_turns": 6, "guide": "all"}}


class Probe:
    """Wraps ``model.forward``: times decode (one-token) and prefill calls; with a guide, masks
    the last logits of a row writing an assistant (or tool) message to the real message's next
    token. Rows are recognised by their prompt, messages by the ChatML headers."""

    def __init__(self, model: Any, tok: Any, tasks: list, guide: str, cfg: RolloutConfig) -> None:
        self.model, self.orig, self.rows = model, model.forward, []
        self.decode_calls, self.decode_s, self.prefill_s, self.forced_s = 0, 0.0, 0.0, 0.0
        self.decode_kv_positions = self.decode_kv_real = 0
        self.end = chat.marker_id(tok, chat.IM_END)
        start = chat.marker_id(tok, chat.IM_START)
        self.headers = {k: [start, *chat.encode_text(tok, f"{k}\n")] for k in ("assistant", "tool")}
        kinds = {"act": ("assistant",), "all": ("assistant", "tool"), "none": ()}[guide]
        text = {"assistant": chat.assistant_text, "tool": lambda m: str(m["content"] or "")}
        self.prompts = [Engine(model, tok, cfg).start(t).ids for t in tasks]
        reals = [real_trajectory(t).dump()["messages"] for t in tasks]
        self.targets = [{k: [chat.encode_text(tok, text[k](m)) + [self.end] for m in real
                             if m["role"] == k] for k in kinds} for real in reals]
        model.forward = self  # type: ignore[method-assign]
        self.orig_select = DynamicCache.batch_select_indices
        probe = self
        DynamicCache.batch_select_indices = (  # type: ignore[method-assign]
            lambda cache, indices: probe._select(cache, indices))

    def _feed(self, row: dict[str, Any], token: int) -> None:
        if row["cur"] is not None:
            kind, k, pos = row["cur"]
            row["cur"] = None if token == self.end else (kind, k, pos + 1)
        row["win"] = (row["win"] + [token])[-4:]
        for kind, hdr in self.headers.items():
            if row["win"][-len(hdr):] == hdr:
                row["cur"] = (kind, row["n"][kind], 0)
                row["n"][kind] += 1

    def _row(self, ids: list[int]) -> dict[str, Any]:
        task = next((i for i, p in enumerate(self.prompts) if ids[:len(p)] == p), None)
        row = {"task": task, "cur": None, "win": [], "n": {"assistant": 0, "tool": 0}}
        for t in ids:
            self._feed(row, t)
        return row

    def __call__(self, *args: Any, **kw: Any) -> Any:
        ids, mask = kw["input_ids"], kw["attention_mask"]
        prefill = kw[CACHE_KW].get_seq_length() == 0
        t = time.perf_counter()
        out = self.orig(*args, **kw)
        dt = time.perf_counter() - t
        if prefill:
            self.prefill_s += dt
            self.rows = [self._row(r[m.bool()].tolist()) for r, m in zip(ids, mask, strict=True)]
            last = [ids.shape[1] - 1] * len(self.rows)  # left-padded: each row ends last
        else:
            n = mask[:, -ids.shape[1]:].sum(-1).tolist()  # a row's chunk is left-aligned
            if ids.shape[1] == 1:
                self.decode_calls, self.decode_s = self.decode_calls + 1, self.decode_s + dt
                self.decode_kv_positions += mask.numel()  # what attention reads, pads too
                self.decode_kv_real += int(mask.sum())  # of which real tokens
            else:
                self.forced_s += dt
            for row, toks, k in zip(self.rows, ids.tolist(), n, strict=True):
                for tok in toks[:k]:
                    self._feed(row, tok)
            last = [max(k - 1, 0) for k in n]
        for i, row in enumerate(self.rows):
            if row["cur"] is None or row["task"] is None:
                continue
            kind, k, pos = row["cur"]
            msgs = self.targets[row["task"]].get(kind, [])
            if k < len(msgs) and pos < len(msgs[k]):
                logits = out.logits[i, _kept_column(kw.get("logits_to_keep", 0), ids.shape[1],
                                                    last[i])]
                logits[:] = torch.finfo(logits.dtype).min
                logits[msgs[k][pos]] = 0.0
        return out

    def _select(self, cache: Any, indices: torch.Tensor) -> None:
        """Rows leaving the batch (or copied from a shared prompt) leave the probe too."""
        self.rows = [dict(self.rows[i], n=dict(self.rows[i]["n"]), win=list(self.rows[i]["win"]))
                     for i in indices.tolist()]
        self.orig_select(cache, indices)

    def close(self) -> None:
        del self.model.forward
        DynamicCache.batch_select_indices = self.orig_select  # type: ignore[method-assign]


def _kept_column(keep: Any, width: int, position: int) -> int:
    """Where position `position` of a forward `width` wide sits in its logits when the backend
    projected only `logits_to_keep` positions (an int: the last ones; 0: all; a sorted index
    tensor: those)."""
    if isinstance(keep, torch.Tensor):
        return int(torch.searchsorted(keep.cpu(), torch.tensor(position)))
    return position if not keep else position - (width - int(keep))


def _push(eng: Engine, r: Any, tok: int, lp: float, cfg: RolloutConfig) -> bool:
    """Append one token to a row exactly as ``run_episodes`` does; True when a message ended."""
    return push_token(eng, r, tok, lp, cfg, eng.tok)


@torch.no_grad()
def reencode_episodes(model: Any, tok: Any, tasks: list, cfg: RolloutConfig
                      ) -> tuple[list[Episode], int]:
    """The plain tool loop: every message starts from a full re-encode of its episode so far."""
    eng = Engine(model, tok, cfg)
    rows, prompt_lens = eng.start_all(tasks)
    gen, forward = torch.Generator().manual_seed(cfg.seed), 0
    while True:
        for r in rows:  # forced text is plain text here: it is encoded with the next message
            while r.done is None and r.queue:
                _push(eng, r, 0, 0.0, cfg)
        live = [r for r in rows if r.done is None]
        if not live:
            break
        stepper = HFStepper(model, eng.pad, packed=cfg.packed_linear)  # fresh cache each time
        logits = stepper.prefill([r.ids for r in live])
        writing = [True] * len(live)
        while True:
            toks, logps = sample(logits, cfg.temperature, cfg.top_p, gen)
            for i, r in enumerate(live):
                if writing[i] and _push(eng, r, int(toks[i]), float(logps[i]), cfg):
                    writing[i] = False
            if not any(writing):
                break
            logits = stepper.step([r.ids[-1] for r in live], writing)
        forward += stepper.forward_tokens
    return [eng.episode(r, n) for r, n in zip(rows, prompt_lens, strict=True)], forward


DEFAULT_COMPACT = hf.COMPACT_BELOW


def kv_bytes_per_position(model: Any) -> int:
    """Bytes of keys and values one cached position holds over all layers."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    size = next(model.parameters()).element_size()
    return c.num_hidden_layers * 2 * kv_heads * head_dim * size


def copy_bandwidth(threads: int, mib: int = 256, reps: int = 5) -> float:
    """GB/s of a large tensor copy (read + write bytes), best of ``reps``, on ``threads``."""
    old, x = torch.get_num_threads(), torch.ones(mib * 2**20 // 4)
    y = torch.empty_like(x).copy_(x)  # touch the pages first
    torch.set_num_threads(threads)
    best = min(_timed(lambda: y.copy_(x)) for _ in range(reps))
    torch.set_num_threads(old)
    return 2 * x.numel() * x.element_size() / best / 1e9


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_path(name: str, given: str | None) -> tuple[Path, str]:
    """The folder to benchmark and a note on what it is (see the module docstring)."""
    if given:
        return Path(given), "given on the command line"
    sft = default_cache_dir() / f"bench-sft-{name}"
    if not read_marker(sft) and name == "tiny":
        cmd = [sys.executable, "-m", "envace.cli", "sft", "--preset", "tiny", "--out", str(sft)]
        print("$", " ".join(cmd[1:]), "--quiet  (once, ~9 min)", flush=True)
        subprocess.run([*cmd, "--quiet"], check=True)
    if read_marker(sft):
        return sft, f"cold start by `envace sft --preset {name} --out {sft}`"
    return resolve_model(name, default_cache_dir()), "zero-shot preset (no cold start cached)"


def bench_model(path: Path, tasks: list, cfg: RolloutConfig, bw: float, guide: str,
                reencode: bool = True) -> dict[str, Any]:
    model, tok = load_model(path)
    model.eval()
    fp32_bytes = sum(p.numel() * 4 for p in model.parameters())
    # the model the rollout decodes with (cfg.gen_dtype: itself, or its bf16 copy), probed and
    # used by the reference too, so that both sides decode in the same dtype
    gen = generation_model(model, cfg.gen_dtype)
    param_bytes = sum(p.numel() * p.element_size() for p in gen.parameters())
    run_episodes(model, tok, tasks[:1], RolloutConfig(**{**vars(cfg), "max_turns": 1,
                                                         "max_new_tokens": 2}))  # warm-up
    probe = Probe(gen, tok, tasks, guide, cfg)
    t = time.perf_counter()
    try:
        ours = run_episodes(model, tok, tasks, cfg)
    finally:
        probe.close()  # unwrap, even on failure; a fresh probe for the reference
    t_ours = time.perf_counter() - t
    if reencode:
        ref_probe = Probe(gen, tok, tasks, guide, cfg)
        t = time.perf_counter()
        try:
            ref, ref_forward = reencode_episodes(gen, tok, tasks, cfg)
        finally:
            ref_probe.close()
        t_ref = time.perf_counter() - t
    else:  # no reference run (--no-reencode): its columns are empty
        ref, ref_forward, t_ref = [], 0, float("nan")
    g_ours = sum(e.tokens(ACT) + e.tokens(REHEARSE) for e in ours)
    g_ref = sum(e.tokens(ACT) + e.tokens(REHEARSE) for e in ref)
    fwd_rate, e2e_rate = probe.decode_calls / probe.decode_s, probe.decode_calls / t_ours
    kv_bytes = probe.decode_kv_positions / max(probe.decode_calls, 1) * kv_bytes_per_position(gen)
    return {
        "model": str(path), "parameters": sum(p.numel() for p in model.parameters()),
        "gen_dtype": cfg.gen_dtype, "param_bytes_per_decode_step": param_bytes,
        "episodes": len(tasks), "guide": guide,
        "ours": {"seconds": t_ours, "generated_tokens": g_ours, "tokens_per_s": g_ours / t_ours,
                 "forward_tokens": sum(len(e.ids) for e in ours), "prefill_s": probe.prefill_s,
                 "forced_chunk_s": probe.forced_s,
                 "decode_steps": probe.decode_calls, "decode_forward_s": probe.decode_s},
        "reencode": {"seconds": t_ref, "generated_tokens": g_ref,
                     "tokens_per_s": g_ref / t_ref if ref else None,
                     "forward_tokens": ref_forward} if reencode else None,
        "speedup": (g_ours / t_ours) / (g_ref / t_ref) if g_ref and g_ours else None,
        "identical_episodes": sum(a.ids == b.ids for a, b in zip(ours, ref, strict=True))
        if reencode else None,
        "act_tokens": sum(e.tokens(ACT) for e in ours),
        "rehearse_tokens": sum(e.tokens(REHEARSE) for e in ours),
        "messages_per_episode": sum(len(e.trajectory.messages) for e in ours) / len(ours),
        "tool_calls_per_episode": sum(len(c) for e in ours for c in e.calls_per_turn) / len(ours),
        "end_reasons": dict(Counter(e.end_reason.split(":")[0] for e in ours)),
        "ceiling": ceiling_block(bw, param_bytes, fp32_bytes, kv_bytes, fwd_rate, e2e_rate,
                                 probe.decode_kv_real / max(probe.decode_kv_positions, 1)),
    }


def ceiling_block(bw: float, param_bytes: float, fp32_bytes: float, kv_bytes: float,
                  fwd_rate: float, e2e_rate: float, kv_real_share: float) -> dict[str, float]:
    """Decode steps against the weights-only bandwidth ceiling: at `bw` GB/s a step that reads
    `param_bytes` of weights runs at most bw * 1e9 / param_bytes times a second; the achieved
    forward and end-to-end step rates as shares of it, of a ceiling that also counts the KV
    cache a step reads (`kv_bytes`), and of one that counts the fp32 weights' bytes."""
    ceiling = bw * 1e9 / param_bytes
    return {"copy_bandwidth_gb_s": bw, "decode_steps_per_s": ceiling,
            "achieved_forward_steps_per_s": fwd_rate,
            "achieved_end_to_end_steps_per_s": e2e_rate,
            "ratio_forward": fwd_rate / ceiling, "ratio_end_to_end": e2e_rate / ceiling,
            # a decode step also reads the whole (padded) KV cache of every row
            "kv_bytes_per_decode_step": kv_bytes, "kv_real_share": kv_real_share,
            "ratio_forward_with_kv": fwd_rate / (bw * 1e9 / (param_bytes + kv_bytes)),
            # against the fp32 weights' bytes (what the same model reads undowncast)
            "ratio_forward_fp32_bytes": fwd_rate / (bw * 1e9 / fp32_bytes)}


def repeat_ratios(variant: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, Any]:
    """A variant against the base, interleaved repeats paired in order: per rate, the ratio of
    each repeat and their median (the figure)."""
    out: dict[str, Any] = {}
    for k in ("achieved_forward_steps_per_s", "achieved_end_to_end_steps_per_s"):
        each = [o[k] / b[k] for o, b in zip(variant, base, strict=True)]
        out[k] = statistics.median(each)
        out[f"{k}_each_repeat"] = each
    return out


def variant_key(name: str, dtype: str, kernel: str, below: float = DEFAULT_COMPACT) -> str:
    """``smollm2``, ``smollm2@bfloat16``, ``smollm2+plain``, ``smollm2@bfloat16+plain``,
    ``smollm2+compact0`` (a cache compaction threshold other than the default)."""
    return (name + ("" if dtype == "same" else f"@{dtype}")
            + ("" if kernel == "packed" else f"+{kernel}")
            + ("" if below == DEFAULT_COMPACT else f"+compact{below:g}"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(PLAN), default=["tiny", "smollm2"])
    ap.add_argument("--tiny", help="tiny model folder (default: the cached cold start)")
    ap.add_argument("--smollm2", help="smollm2 model folder (default: cold start or zero-shot)")
    ap.add_argument("--tasks", type=int, help="episodes per batch (default: tiny 8, smollm2 2)")
    ap.add_argument("--max-new-tokens", type=int, help="per message (default 96)")
    ap.add_argument("--max-turns", type=int, help="assistant messages per episode (30 / 6)")
    ap.add_argument("--guide", choices=["act", "all", "none"],
                    help="steer acting (act), also rehearsing (all) or nothing (none) along the "
                         "real trajectory (default: tiny act, smollm2 all)")
    ap.add_argument("--min-calls", type=int, default=6, help="ground-truth calls per task")
    ap.add_argument("--gen-dtype", nargs="+", choices=sorted(GEN_DTYPES), default=["same"],
                    help="decode with the model itself (same) and/or its bf16 copy (bfloat16; "
                         "the ceiling then counts bf16 bytes, ratio_forward_fp32_bytes fp32's); "
                         "several: each in turn, same tasks, and their ratio in `ratios`")
    ap.add_argument("--kernels", nargs="+", choices=["packed", "plain"], default=["packed"],
                    help="linear layers on oneDNN-packed weights (packed, the default) and/or "
                         "plain F.linear; several: each in turn, same tasks, ratios in `ratios` "
                         "against the first variant (--gen-dtype x --kernels, in that order)")
    ap.add_argument("--compact-below", nargs="+", type=float, default=[DEFAULT_COMPACT],
                    help="compact the KV cache when less than this share of it is real tokens "
                         f"(default {DEFAULT_COMPACT}; 0: never); several: each in turn")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the variants this many times, interleaved; a variant's row is "
                         "its median repeat and `ratios` the median of per-repeat ratios")
    ap.add_argument("--no-reencode", action="store_true",
                    help="skip the re-encoding reference (its columns stay empty)")
    ap.add_argument("--name", default="rollout_engine",
                    help="result file bench/results/<name>.json (another name keeps the default's)")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    quiet = load < 1.5
    print(f"1-minute load average {load:.2f}: {'quiet' if quiet else 'BUSY (figures noisy)'}")
    long = [t for t in split_tasks("dev") if sum(len(g) for g in t.ground_truth) >= args.min_calls]
    decode_threads = inspect.signature(HFStepper).parameters["decode_threads"].default
    bw, bw_all = copy_bandwidth(decode_threads), copy_bandwidth(torch.get_num_threads())
    results: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for name in args.only:
        plan = {k: getattr(args, k) or v for k, v in PLAN[name].items()}
        path, note = model_path(name, getattr(args, name))
        variants = [(d, k, c) for d in args.gen_dtype for k in args.kernels
                    for c in args.compact_below]
        runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.repeats):  # variants interleaved: a slow minute hits one repeat
            for dtype, kernel, below in variants:
                hf.COMPACT_BELOW = below
                cfg = RolloutConfig(mode="rehearse", temperature=0.0,
                                    max_new_tokens=plan["max_new_tokens"],
                                    max_turns=plan["max_turns"], max_context=4096, seed=0,
                                    gen_dtype=dtype, packed_linear=kernel == "packed")
                key = variant_key(name, dtype, kernel, below)
                print(f"[{key} #{rep + 1}] {path} ({note}): {plan}", flush=True)
                runs.setdefault(key, []).append(
                    {"note": note, "plan": plan, "linear_kernel": kernel, "compact_below": below,
                     **bench_model(path, long[:plan["tasks"]], cfg, bw, plan["guide"],
                                   reencode=not args.no_reencode)})
        for key, got in runs.items():  # the repeat with the median decode rate stands for it
            by_rate = sorted(got, key=lambda r: r["ceiling"]["achieved_forward_steps_per_s"])
            results[key] = {**by_rate[(len(by_rate) - 1) // 2],
                            "repeats": [r["ceiling"] for r in got]}
        if len(variants) > 1:
            base_key = variant_key(name, *variants[0])
            ratios[name] = {"base": base_key}
            for v in variants[1:]:
                key = variant_key(name, *v)
                ratios[name][key] = repeat_ratios([r["ceiling"] for r in runs[key]],
                                                  [r["ceiling"] for r in runs[base_key]])
    nan = float("nan")
    rows = [[n, r["episodes"], r["guide"], r["ours"]["generated_tokens"],
             (r["reencode"] or {}).get("generated_tokens"), r["identical_episodes"],
             r["rehearse_tokens"], r["messages_per_episode"], r["ours"]["tokens_per_s"],
             (r["reencode"] or {}).get("tokens_per_s") or nan, r["speedup"] or nan,
             r["ceiling"]["decode_steps_per_s"], r["ceiling"]["ratio_forward"],
             r["ceiling"]["ratio_forward_fp32_bytes"], r["ceiling"]["ratio_end_to_end"],
             r["ceiling"]["kv_bytes_per_decode_step"] / r["param_bytes_per_decode_step"],
             r["ceiling"]["ratio_forward_with_kv"]]
            for n, r in results.items()]
    print(table(rows, ["model", "eps", "guide", "gen ours", "gen ref", "same", "rehearse tok",
                       "msgs/ep", "ours tok/s", "reencode tok/s", "speedup", "ceiling steps/s",
                       "fwd/ceil", "fwd/fp32 ceil", "e2e/ceil", "kv/weight bytes",
                       "fwd/(weights+kv) ceil"]))
    for by in ratios.values():
        for d, r in by.items():
            if d == "base":
                continue
            print(f"{d} / {by['base']} (median of repeats): decode forward steps/s x"
                  f"{r['achieved_forward_steps_per_s']:.2f}, end to end "
                  f"x{r['achieved_end_to_end_steps_per_s']:.2f}")
    path = write_result(args.name, {
        "quiet_machine": quiet, "load_avg_1min": load, "load_avg_1min_end": os.getloadavg()[0],
        "command": " ".join(["python -m bench.rollout_engine", *(argv or sys.argv[1:])]),
        "guide": "act: assistant messages steered to the real ones by logit masking, the model "
                 "rehearses freely; all: tool responses steered too (module docstring)",
        "torch_threads": torch.get_num_threads(), "decode_threads": decode_threads,
        "copy_bandwidth_gb_s": {"decode_threads": bw, "all_threads": bw_all},
        "sampling": "greedy (temperature 0), seed 0", "min_ground_truth_calls": args.min_calls,
        "models": results, "ratios": ratios})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
