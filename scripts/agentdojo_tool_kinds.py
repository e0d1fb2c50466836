"""Classify every AgentDojo tool as READ or WRITE by observation (data/agentdojo_tool_kinds.json).

    .venv/bin/python scripts/agentdojo_tool_kinds.py

Per suite, a tool is WRITE if any observed call changed the environment (state hash before !=
after), READ if it ran without error and never did. Observed calls: the ground truth of every user
and injection task of v1.2.2 (on environments with the harmless default injection texts), then one
probe call (``PROBES``, arguments taken from the suite's data) for each tool those never call.
Names mislead here: ``get_unread_emails`` marks mail read and slack's ``get_webpage`` logs the
request, so both are WRITE.
"""

from __future__ import annotations

import argparse
import json

from envace.core.envs.agentdojo.env import TOOL_KINDS_FILE, AgentDojoEnv
from envace.core.envs.agentdojo.tasks import DEFAULT_VERSION, SUITES, default_environment, suites

PROBES: dict[str, list[tuple[str, dict]]] = {
    "workspace": [
        ("delete_email", {"email_id": "0"}), ("get_sent_emails", {}),
        ("get_received_emails", {}), ("get_draft_emails", {}),
        ("search_contacts_by_email", {"query": "bluesparrowtech"}),
        ("cancel_calendar_event", {"event_id": "6"}), ("get_file_by_id", {"file_id": "0"}),
    ],
    "travel": [
        ("get_user_information", {}),
        ("get_contact_information_for_restaurants",
         {"restaurant_names": ["New Israeli Restaurant"]}),
        ("get_car_rental_address", {"company_name": ["SunSet Rent-A-Car"]}),
        ("get_day_calendar_events", {"day": "2024-05-15"}),
        ("search_calendar_events", {"query": "", "date": None}),
        ("cancel_calendar_event", {"event_id": "0"}),
        ("reserve_car_rental", {"company": "SunSet Rent-A-Car", "start_time": "2024-05-20 09:00",
                                "end_time": "2024-05-22 09:00"}),
        ("reserve_restaurant", {"restaurant": "New Israeli Restaurant",
                                "start_time": "2024-05-20 19:00"}),
    ],
    "banking": [("get_balance", {}), ("get_iban", {}), ("get_user_info", {})],
    "slack": [("remove_user_from_slack", {"user": "Eve"})],
}


def observe(env: AgentDojoEnv, calls: list[tuple[str, dict]], seen: dict[str, bool]) -> None:
    for name, args in calls:
        before = env.state_hash()
        if env.execute(name, args).error:
            continue
        seen[name] = seen.get(name, False) or env.state_hash() != before


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    env = AgentDojoEnv(DEFAULT_VERSION)
    kinds: dict[str, dict[str, str]] = {}
    for suite_name in SUITES:
        suite = suites(DEFAULT_VERSION)[suite_name]
        seen: dict[str, bool] = {}
        for tid in suite.user_tasks:
            env.reset(f"{suite_name}/{tid}")
            observe(env, [(c.name, c.kwargs) for c in env.task.ground_truth[0]], seen)
        for task in suite.injection_tasks.values():
            env.reset({"suite": suite_name, "version": DEFAULT_VERSION})
            calls = task.ground_truth(default_environment(DEFAULT_VERSION, suite_name))
            observe(env, [(c.function, dict(c.args)) for c in calls], seen)
        for name, args in PROBES.get(suite_name, []):
            if name not in seen:
                env.reset({"suite": suite_name, "version": DEFAULT_VERSION})
                observe(env, [(name, args)], seen)
        missing = sorted({f.name for f in suite.tools} - set(seen))
        if missing:
            print(f"{suite_name}: never observed: {', '.join(missing)}")
        kinds[suite_name] = {k: "write" if v else "read" for k, v in sorted(seen.items())}
    TOOL_KINDS_FILE.write_text(json.dumps(kinds, indent=1) + "\n")
    for s, k in kinds.items():
        writes = sorted(t for t, v in k.items() if v == "write")
        print(f"{s}: {len(writes)} write, {len(k) - len(writes)} read: writes {', '.join(writes)}")


if __name__ == "__main__":
    main()
