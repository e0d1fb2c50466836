"""One audit across a Ray cluster: N shard tasks (``envace-audit replay --shard I/N``), then
``envace-audit merge`` into the audit a single run gives (docs/scaling.md, "Audits across
machines").

    python scripts/audit_ray.py IN.jsonl... --shards 8 --work /shared/shards --out /shared/audit \\
        [--address auto] [-- --verdict json_f1 --threshold 0.9 ...]

Every task runs the ``envace-audit`` command itself (same options, exit codes and all-or-nothing
writer), so the input, ``--work`` and ``--out`` must be paths every node sees (a shared
filesystem). ``--address`` joins a running cluster (``auto``: the one ``ray start`` made on this
node); without it Ray starts a local one. Exit code: 2 when a shard failed (its code is printed),
else the merge's (0, or 3 when records were skipped). Needs ``pip install 'envace[ray]'``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run(inputs: list[str], shards: int, work: str, out: str, extra: list[str] | None = None,
        address: str | None = None, num_cpus: int | None = None) -> int:
    """Audit ``inputs`` in ``shards`` Ray tasks, merge into ``out``; the exit code."""
    import ray

    from audit.cli import main as audit_main

    dirs = [str(Path(work) / f"shard_{i}") for i in range(shards)]

    @ray.remote(num_cpus=1)
    def shard(i: int) -> int:
        from audit.cli import main

        return main(["--quiet", "replay", *inputs, "--shard", f"{i}/{shards}",
                     "--out", dirs[i], *(extra or [])])

    ray.init(address=address, num_cpus=num_cpus, include_dashboard=False,
             ignore_reinit_error=True)
    try:
        codes = ray.get([shard.remote(i) for i in range(shards)])
    finally:
        ray.shutdown()
    failed = [(i, c) for i, c in enumerate(codes) if c not in (0, 3)]
    for i, c in failed:
        print(f"audit_ray: shard {i}/{shards} exited {c}", file=sys.stderr)
    if failed:
        return 2
    return audit_main(["--quiet", "merge", *dirs, "--out", out])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--work", required=True, help="where the shard directories go")
    ap.add_argument("--out", required=True)
    ap.add_argument("--address", default=None, help="a running Ray cluster (e.g. auto)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be at least 1")
    return run(args.inputs, args.shards, args.work, args.out, extra, args.address)


if __name__ == "__main__":
    raise SystemExit(main())
