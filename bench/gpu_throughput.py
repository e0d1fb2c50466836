"""Rollout and update throughput, peak memory and model FLOP utilisation at Qwen3 shapes.

    python -m bench.gpu_throughput --out throughput.json            # CUDA: Qwen3-0.6B, -1.7B
    python -m bench.gpu_throughput --toy --out throughput.json      # any device, seconds on a CPU

Models are built from a ``Qwen3Config`` with the real shapes and random weights (nothing is
downloaded), in bf16 on the GPU. Two measurements per shape, both through envace's own code:

- **rollout**: the transformers engine's lockstep decoding (``envace.model.backends.hf.HFStepper``
  and ``sample``, what ``envace.model.rollout.run_episodes`` drives) at the presets' batch sizes
  (``configs/qwen3_1.7b.yaml``: 16 prompts x 4 rollouts = 64 rows): left-padded prompts of
  mixed lengths are prefilled, then every row samples ``gen_len`` tokens (no stop token, so
  every step decodes the whole batch). Generated tokens/s counts decoding only; prefill is
  timed on its own.
- **update**: ``envace.training.update.update`` (the role-wise GRPO loss, micro-batches of the
preset's
  ``micro_batch_size`` 4, backward, AdamW step) over as many sequences as a rollout made.
  Update tokens/s counts every position of every sequence.

Peak GPU memory is ``torch.cuda.max_memory_allocated`` per phase (the CPU reports the process's
peak RSS instead). MFU = model FLOPs / time / peak, model FLOPs per token (forward) =
2 x matmul parameters (lm_head included, embeddings not) + 4 x layers x heads x head_dim x
attended positions; an update costs 3x the forward. Peak: the H200 SXM's dense bf16 rate,
989.5 TFLOP/s (NVIDIA H200 datasheet: 1979 TFLOP/s "with sparsity", halved), and, measured
in the same run, an 8192^3 bf16 matmul (the device notes saw 769-798 TFLOP/s on one). The
result is written after every measurement, so a run stopped at its time cap keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from bench.machine import table

H200_BF16_DENSE_TFLOPS = 989.5  # NVIDIA H200 SXM datasheet: 1979 with 2:4 sparsity, halved
PEAK_SOURCE = "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1979 TFLOP/s with sparsity; " \
    "dense = half"

# Qwen3 shapes (the public config.json of each model); random weights, no download
QWEN3_COMMON: dict[str, Any] = {"num_attention_heads": 16, "num_key_value_heads": 8,
                                "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
                                "max_position_embeddings": 40960, "rope_theta": 1_000_000.0,
                                "rms_norm_eps": 1e-6, "hidden_act": "silu"}
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {**QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28},
    "qwen3-1.7b": {**QWEN3_COMMON, "hidden_size": 2048, "intermediate_size": 6144,
                   "num_hidden_layers": 28},
    # seconds on a CPU: the same code at a size that only checks it runs
    "toy": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 512, "tie_word_embeddings": True, "max_position_embeddings": 512,
            "rope_theta": 10000.0},
}


@dataclass
class Plan:
    """What to measure: shapes, rollout batch sizes and lengths, the update's micro-batch."""

    shapes: tuple[str, ...] = ("qwen3-0.6b", "qwen3-1.7b")
    batches: tuple[int, ...] = (16, 64)  # 64 = the presets' 16 prompts x 4 rollouts
    prompt_len: int = 1024  # longest prompt; rows are left-padded from prompt_len / 2 up
    gen_len: int = 128  # tokens each row generates
    micro_batch: int = 4  # the presets' micro_batch_size
    dtype: str = "bfloat16"
    matmul_n: int = 8192


TOY = Plan(shapes=("toy",), batches=(4,), prompt_len=32, gen_len=8, micro_batch=2,
           dtype="float32", matmul_n=256)


def build_model(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """A Qwen3ForCausalLM of this shape with random weights, made on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**SHAPES[shape], bos_token_id=None, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    return model.to(dtype)


def matmul_params(cfg: Any) -> int:
    """Weights that take part in a matmul per token: every layer's projections and lm_head."""
    h, q = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size
    return cfg.num_hidden_layers * per_layer + cfg.vocab_size * h


def forward_flops(cfg: Any, tokens: int, attended: float) -> float:
    """Model FLOPs of a forward over ``tokens`` tokens that attend to ``attended`` positions
    each on average (2 per multiply-add; attention scores and values counted)."""
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * attended
    return tokens * (2.0 * matmul_params(cfg) + attn)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, reps: int = 10) -> float:
    """Achieved TFLOP/s of an n^3 matmul on random data (median of ``reps`` after 3 warm-ups)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(3 + reps):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def _prompts(batch: int, prompt_len: int, vocab: int, gen: torch.Generator) -> list[list[int]]:
    lens = torch.randint(max(1, prompt_len // 2), prompt_len + 1, (batch,), generator=gen)
    return [torch.randint(1, vocab, (int(n),), generator=gen).tolist() for n in lens]


def rollout(model: Any, batch: int, prompt_len: int, gen_len: int, seed: int = 0
            ) -> dict[str, float]:
    """Prefill ``batch`` left-padded prompts, then sample ``gen_len`` tokens per row."""
    from envace.model.backends.hf import HFStepper, sample

    device = next(model.parameters()).device
    cfg = model.config
    prompts = _prompts(batch, prompt_len, cfg.vocab_size, torch.Generator().manual_seed(seed))
    gen = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    stepper = HFStepper(model, pad_id=0)
    logits = stepper.prefill(prompts)
    _sync(device)
    t1 = time.perf_counter()
    for _ in range(gen_len):
        toks, _ = sample(logits, 1.0, 1.0, gen)
        logits = stepper.step(toks.tolist(), [True] * batch)
    _sync(device)
    t2 = time.perf_counter()
    prompt_tokens = sum(len(p) for p in prompts)
    mean_prompt = prompt_tokens / batch
    prefill_flops = forward_flops(cfg, prompt_tokens, (mean_prompt + 1) / 2)
    decode_flops = forward_flops(cfg, batch * gen_len, mean_prompt + (gen_len + 1) / 2)
    return {"batch": batch, "prompt_tokens": prompt_tokens, "generated_tokens": batch * gen_len,
            "prefill_s": t1 - t0, "decode_s": t2 - t1,
            "prefill_tokens_per_s": prompt_tokens / (t1 - t0),
            "generated_tokens_per_s": batch * gen_len / (t2 - t1),
            "generated_tokens_per_s_with_prefill": batch * gen_len / (t2 - t0),
            "prefill_tflops": prefill_flops / (t1 - t0) / 1e12,
            "decode_tflops": decode_flops / (t2 - t1) / 1e12,
            "peak_memory_gib": _peak_gib(device)}


def _episodes(n: int, prompt_len: int, gen_len: int, vocab: int, seed: int) -> list[Any]:
    """Synthetic episodes of the trainer's shape: a context prompt, then generated tokens
    (half act, half rehearse), recorded log-probs near the model's (ratios near 1)."""
    from envace.model.rollout import ACT, CONTEXT, REHEARSE, Episode

    g = torch.Generator().manual_seed(seed)
    out = []
    for ids in _prompts(n, prompt_len, vocab, g):
        p = len(ids)
        ids = ids + torch.randint(1, vocab, (gen_len,), generator=g).tolist()
        roles = [CONTEXT] * p + [ACT] * (gen_len // 2) + [REHEARSE] * (gen_len - gen_len // 2)
        logp = [0.0] * p + [-float(torch.log(torch.tensor(float(vocab))))] * gen_len
        out.append(Episode(task=None, trajectory=None, ids=ids, roles=roles, logprobs=logp,
                           step_of_token=[-1] * len(ids), prompt_len=p, end_reason="bench",
                           calls_per_turn=[]))
    return out


def update(model: Any, n_seqs: int, prompt_len: int, gen_len: int, micro_batch: int,
           seed: int = 0) -> dict[str, float]:
    """One ``envace.training.update.update`` (mode envace) over ``n_seqs`` synthetic episodes."""
    from envace.training.config import TrainConfig
    from envace.training.train_setup import Policy
    from envace.training.update import update as grpo_update

    device = next(model.parameters()).device
    cfg = TrainConfig(micro_batch_size=micro_batch, lr=1e-7, mode="envace", kl_coef=0.0)
    policy = Policy(model=model, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=0),
                    path=Path("random-weights"))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    policy.optimizers["policy"] = opt
    policy.schedulers["policy"] = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model.train()
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(n_seqs, 2, generator=g)
    # warm-up (allocator, kernels, AdamW state) on one micro-batch, outside the timing
    warm = _episodes(micro_batch, prompt_len, gen_len, model.config.vocab_size, seed + 1)
    grpo_update(policy, warm, adv[:micro_batch], cfg)
    eps = _episodes(n_seqs, prompt_len, gen_len, model.config.vocab_size, seed)
    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    st = grpo_update(policy, eps, adv, cfg)
    _sync(device)
    secs = time.perf_counter() - t0
    tokens = sum(len(e.ids) for e in eps)
    mean_len = tokens / n_seqs
    flops = 3 * forward_flops(model.config, tokens, (mean_len + 1) / 2)
    return {"sequences": n_seqs, "tokens": tokens, "trained_tokens": n_seqs * gen_len,
            "micro_batch": micro_batch, "seconds": secs, "tokens_per_s": tokens / secs,
            "tflops": flops / secs / 1e12, "peak_memory_gib": _peak_gib(device),
            "loss": float(st.get("loss", float("nan"))),
            "grad_norm": float(st.get("grad_norm", float("nan")))}


def run(plan: Plan, out: Path | None = None, device: str | None = None) -> dict[str, Any]:
    """Measure every shape of ``plan``; the result (also written to ``out`` after every
    measurement) holds per-shape rows and the three tables."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, plan.dtype)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
        or platform.machine(),
        "device_type": dev.type, "torch": torch.__version__, "dtype": plan.dtype,
        "plan": plan.__dict__ | {"shapes": list(plan.shapes), "batches": list(plan.batches)},
        "peak_tflops_datasheet": H200_BF16_DENSE_TFLOPS, "peak_source": PEAK_SOURCE,
        "shapes": {}}
    import transformers

    res["transformers"] = transformers.__version__

    def save() -> None:
        if out is not None:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(res, indent=1) + "\n")
            os.replace(tmp, out)

    t = time.perf_counter()
    res["matmul_tflops_measured"] = matmul_tflops(dev, dtype, plan.matmul_n)
    res["matmul_seconds"] = time.perf_counter() - t
    save()
    for shape in plan.shapes:
        model = build_model(shape, dev, dtype)
        row: dict[str, Any] = {"parameters": sum(p.numel() for p in model.parameters()),
                               "matmul_parameters": matmul_params(model.config),
                               "attn_implementation": model.config._attn_implementation,
                               "rollout": []}
        res["shapes"][shape] = row
        rollout(model, plan.batches[0], min(plan.prompt_len, 64), 4)  # warm-up
        for b in plan.batches:
            row["rollout"].append(rollout(model, b, plan.prompt_len, plan.gen_len))
            save()
            _progress(f"{shape} rollout batch {b}: "
                      f"{row['rollout'][-1]['generated_tokens_per_s']:.0f} generated tokens/s")
        n = max(plan.batches)
        row["update"] = update(model, n, plan.prompt_len, plan.gen_len, plan.micro_batch)
        save()
        _progress(f"{shape} update: {row['update']['tokens_per_s']:.0f} tokens/s")
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    res["tables"] = tables(res)
    save()
    return res


def _progress(msg: str) -> None:
    print(f"[gpu_throughput] {msg}", flush=True)


def tables(res: dict[str, Any]) -> dict[str, str]:
    """The rollout, update and memory/MFU tables of a result, as text."""
    peak, meas = res["peak_tflops_datasheet"], res.get("matmul_tflops_measured") or float("nan")
    roll, upd, mem = [], [], []
    for shape, row in res["shapes"].items():
        for r in row["rollout"]:
            roll.append([shape, r["batch"], r["generated_tokens_per_s"],
                         r["prefill_tokens_per_s"], r["decode_s"], r["prefill_s"]])
            mem.append([shape, f"rollout b{r['batch']}", r["peak_memory_gib"],
                        r["decode_tflops"], 100 * r["decode_tflops"] / peak,
                        100 * r["prefill_tflops"] / peak, 100 * r["decode_tflops"] / meas])
        u = row.get("update")
        if u:
            upd.append([shape, u["sequences"], u["micro_batch"], u["tokens_per_s"],
                        u["seconds"], u["loss"]])
            mem.append([shape, "update", u["peak_memory_gib"], u["tflops"],
                        100 * u["tflops"] / peak, float("nan"), 100 * u["tflops"] / meas])
    return {
        "rollout": table(roll, ["shape", "batch", "generated tok/s", "prefill tok/s",
                                "decode s", "prefill s"]),
        "update": table(upd, ["shape", "sequences", "micro-batch", "tokens/s", "seconds",
                              "loss"]),
        "memory_mfu": table(mem, ["shape", "phase", "peak GiB", "TFLOP/s",
                                  f"MFU % of {peak:g}", "prefill MFU %",
                                  "% of measured matmul"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="result JSON (rewritten after every measurement)")
    ap.add_argument("--toy", action="store_true", help="toy sizes: seconds on a CPU")
    ap.add_argument("--device", help="cuda or cpu (default: cuda when there is one)")
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES))
    ap.add_argument("--batches", nargs="+", type=int)
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--gen-len", type=int)
    args = ap.parse_args(argv)
    plan = TOY if args.toy else Plan()
    for key in ("shapes", "batches", "prompt_len", "gen_len"):
        val = getattr(args, key)
        if val is not None:
            setattr(plan, key, tuple(val) if isinstance(val, list) else val)
    res = run(plan, args.out, args.device)
    for name, text in res["tables"].items():
        print(f"\n{name}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
