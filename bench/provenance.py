"""What a result file must record to be a figure of record, and what the docs may cite.

Every ``bench/results/*.json`` records the command that reproduces it (``command``), the machine
(``machine``, from ``bench.machine.machine``) and the load average *during the measurement*, in
one of these forms (``load_problems`` accepts exactly these):

- ``load_average: {"start": [1, 5, 15 min], "end": [...]}`` (``bench.machine.run_record``);
- ``load_avg_1min`` and ``load_avg_1min_end``: numbers, or lists with one value per repeat;
- ``load_not_recorded``: a sentence saying why it was not (a file measured before loads were
  recorded); such a file may not also say ``quiet_machine: true``;
- an aggregation (``load_scope: "aggregation"``: a file computed from runs or from other result
  files, whose own load is the aggregation's, not the measurement's) names where its measurement
  is: ``measured_in``, a list of result file names (each must exist and pass this check itself)
  or ``load_not_recorded`` for inputs that recorded none; and it never says ``quiet_machine``.

A file put together by hand from what its command wrote says so in ``assembled`` (a sentence);
only then may the command write another name. ``quiet_machine: true`` is accepted only where
the recorded 1-minute loads are all below 1.5.
A command's file is ``<--name>.json`` (``--out`` for ``bench.vllm_rollout``, ``--env`` +
``_references`` for ``experiments.references``), else the module's default (``DEFAULT_NAMES``).
``tests/bench/test_results_provenance.py`` holds every file and both docs to this.
"""

from __future__ import annotations

import re
import shlex
from itertools import product
from typing import Any

QUIET = 1.5

# The file each benchmark writes when its command gives no --name (tests check each against the
# module's own source).
DEFAULT_NAMES: dict[str, str] = {
    "audit_throughput": "audit_throughput", "bfcl_replay": "bfcl_replay",
    "claims": "claims_tiny_dev", "compounding": "compounding_bfcl_dev",
    "dashboard_load": "dashboard_load", "decode_compile": "decode_compile",
    "decode_profile": "decode_profile", "fsdp_memory": "fsdp_memory",
    "learning": "learning_tiny", "learning_reeval": "learning_tiny_pool", "presets": "presets",
    "presets_agentdojo": "presets_agentdojo", "ranker_cv": "ranker_cv",
    "references": "bfcl_references", "rehearsal_parallel": "rehearsal_parallel",
    "rehearsal_sweep": "rehearsal_sweep", "rollout_engine": "rollout_engine",
    "sweep_seeds": "rehearsal_sweep_seeds", "trainer_vs_trl": "trainer_vs_trl",
    "vllm_rollout": "vllm_rollout", "world_model_skill": "world_model_skill",
    "world_model_test": "world_model_skill_test", "mcp_bridge": "mcp_bridge",
    "guard_overhead": "guard_overhead", "tau2_probes": "tau2_probes",
    "rollout_guard_overhead": "rollout_guard_overhead",
    "probe_prefix": "probe_prefix", "probe_profile": "probe_profile",
    "likelihood_speed": "likelihood_speed",
    "state_change_cost": "state_change_cost",
    "tau2_context": "tau2_context",
    "fidelity_nll_curve": "fidelity_nll_tiny",
    "trust_gate": "trust_gate_tiny",
    "trust_gate_training": "trust_gate_training_tiny",
    "vllm_trust_gate": "vllm_trust_gate_tiny",
    "audit_ab": "audit_speed_ab",
}

_MODULE = re.compile(r"(?:-m\s+(?:bench|experiments)\.|(?:bench|experiments)/)(\w+)")


def _option(words: list[str], flag: str) -> str | None:
    for i, w in enumerate(words):
        if w == flag and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


def written_name(command: str) -> str | None:
    """The result name (no ``.json``) the *last* benchmark in `command` writes; None when the
    command runs no benchmark of ``bench/`` or the module is unknown."""
    found = list(_MODULE.finditer(command))
    if not found:
        return None
    last = found[-1]
    module = last.group(1)
    try:
        words = shlex.split(command[last.end():])
    except ValueError:
        words = command[last.end():].split()
    words = words[:next((i for i, w in enumerate(words) if w in {"&&", ";", "|"}), len(words))]
    if module == "vllm_rollout":
        return _option(words, "--out") or DEFAULT_NAMES[module]
    if module == "references":
        domain = _option(words, "--domain")
        return f"{_option(words, '--env') or 'bfcl'}{'_' + domain if domain else ''}_references"
    if module == "clustered_intervals":
        return _option(words, "--name") or \
            f"clustered_intervals_{_option(words, '--env') or 'bfcl'}_dev"
    return _option(words, "--name") or DEFAULT_NAMES.get(module)


def _ones(value: Any) -> list[float] | None:
    """The 1-minute load(s) in a recorded load value; None when it is not a load."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and
                                                  not isinstance(v, bool) for v in value):
        return [float(v) for v in value]
    return None


def recorded_loads(record: dict[str, Any]) -> list[float] | None:
    """Every 1-minute load average the record gives for its measurement; None when it gives
    none in an accepted form."""
    avg = record.get("load_average")
    if isinstance(avg, dict):
        start, end = avg.get("start"), avg.get("end")
        if isinstance(start, list) and isinstance(end, list) and start and end \
                and _ones(start) and _ones(end):
            return [float(start[0]), float(end[0])]
        return None
    if "load_avg_1min" in record:
        a, b = _ones(record.get("load_avg_1min")), _ones(record.get("load_avg_1min_end"))
        return a + b if a and b else None
    return None


def load_problems(record: dict[str, Any], exists: set[str]) -> list[str]:
    """What is wrong with the record's load (empty when nothing): see the module docstring."""
    reason = record.get("load_not_recorded")
    if reason is not None and not (isinstance(reason, str) and reason.strip()):
        return ["load_not_recorded must be a sentence saying why"]
    quiet = record.get("quiet_machine")
    if record.get("load_scope") == "aggregation":
        out = ["an aggregation's quiet_machine would describe the aggregation"] \
            if quiet is not None else []
        inputs = record.get("measured_in")
        if isinstance(inputs, list) and inputs and all(isinstance(n, str) for n in inputs):
            out += [f"measured_in names {n}, which is not in bench/results"
                    for n in inputs if n not in exists]
        elif not reason:
            out.append("an aggregation names measured_in (result files) or load_not_recorded")
        return out
    loads = recorded_loads(record)
    if reason:
        return ["quiet_machine: true beside a load that was not recorded"] if quiet else []
    if loads is None:
        return ["no load average during the measurement (load_average, load_avg_1min, or "
                "load_not_recorded with the reason)"]
    if quiet is True and max(loads) >= QUIET:
        return [f"quiet_machine: true but a recorded 1-minute load is {max(loads):.2f}"]
    return []


def problems(name: str, record: Any, exists: set[str]) -> list[str]:
    """Every reason the result file `name` (no ``.json``) is not a figure of record; `exists`
    holds the names of the result files there are."""
    if not isinstance(record, dict):
        return ["not a JSON object"]
    out = []
    machine = record.get("machine")
    if not (isinstance(machine, dict) and machine.get("cpus") and machine.get("platform")):
        out.append("no machine (platform and cpus)")
    command = record.get("command")
    if not (isinstance(command, str) and command.strip()):
        out.append("no command (a string) that reproduces it")
    else:
        wrote = written_name(command)
        assembled = record.get("assembled")
        if isinstance(assembled, str) and assembled.strip():
            pass  # put together by hand from what the command wrote, and says so
        elif wrote is None:
            out.append("the command runs no benchmark of bench/")
        elif wrote != name:
            out.append(f"the command writes {wrote}.json, not {name}.json")
    return out + load_problems(record, exists)


def _expand(pattern: str) -> list[str]:
    """Shell-style brace expansion of one name: ``a{,_b}`` -> ``a``, ``a_b``."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in product(*choices)]


_CITED = re.compile(r"bench/results/([\w{},]+)\.json")


def cited_results(text: str) -> set[str]:
    """The result names a document cites as ``bench/results/<name>.json`` (links included,
    braces expanded)."""
    return {n for m in _CITED.finditer(text) for n in _expand(m.group(1))}
