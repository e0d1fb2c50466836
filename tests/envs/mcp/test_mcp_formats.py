"""The MCP bridge's readers and pure parts: profiles, task files, workdir state, response text.

Property tests (hypothesis) for the parsers: whatever the input, a profile or a task line is
parsed or refused with its own error, never an exception of another kind; a task file's bad line
costs that line; no state path escapes the workdir. Known answers for the response text of each
content block type (real ``mcp_types`` objects).
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import mcp_types as types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.envs.mcp.content import canonical_text, fill_workdir, result_text
from envace.core.envs.mcp.options import McpOptionError, take_mcp_options
from envace.core.envs.mcp.profile import ProfileError, load_config, parse_profile
from envace.core.envs.mcp.tasks import load_tasks, parse_task
from envace.core.envs.mcp.workdir import StateError, check_files, read_state, write_files
from tests.envs.mcp.conftest import CONFIG

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                        max_size=3),
                    max_leaves=12)
KEYS = st.sampled_from(["command", "args", "env", "setup", "writes", "reads", "state_ignore",
                        "volatile", "timeout_s", "startup_timeout_s", "description", "other"])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, JSON, max_size=6) | JSON)
def test_a_profile_is_parsed_or_refused_with_a_profile_error(raw):
    try:
        p = parse_profile("p", raw)
    except ProfileError:
        return
    assert p.command and p.timeout_s > 0 and isinstance(p.args, tuple)


def test_profile_errors_name_the_field(tmp_path):
    for raw, why in [({}, "'command'"), ({"command": "x", "timeout_s": 0}, "timeout_s"),
                     ({"command": "x", "colour": 1}, "unknown field"),
                     ({"command": "x", "setup": [[]]}, "cannot be empty"),
                     ({"command": "x", "volatile": ["("]}, "volatile"),
                     ({"command": "x", "writes": ["a"], "reads": ["a"]}, "both")]:
        with pytest.raises(ProfileError, match=why):
            parse_profile("p", raw)
    bad = tmp_path / "bad.yaml"
    bad.write_text("servers: [1, 2]\n")
    with pytest.raises(ProfileError, match="servers"):
        load_config(bad)
    with pytest.raises(ProfileError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(McpOptionError, match="needs a file"):
        take_mcp_options(["replay", "--mcp-config"])


def test_placeholders_are_filled(tmp_path):
    profiles = load_config(CONFIG)
    git = profiles["git"]
    _, args = git.argv("/w")
    assert args[-1] == "/w" and git.environ("/w")["GIT_CONFIG_GLOBAL"] == "/dev/null"
    cmd, args = profiles["ledger"].argv("/w")
    assert args == [str(CONFIG.parent / "servers" / "ledger_server.py")]
    assert profiles["ledger"].environ("/w") == {"LEDGER_DB": "/w/ledger.json"}
    assert take_mcp_options(["replay", f"--mcp-config={CONFIG}", "x"]) == ["replay", "x"]


LINES = st.one_of(
    st.text(max_size=40),
    JSON.map(json.dumps),
    st.fixed_dictionaries({"id": st.text(min_size=1, max_size=5)},
                          optional={"prompt": JSON, "state": JSON, "ground_truth": JSON,
                                    "split": st.sampled_from(["train", "dev", "x"])}
                          ).map(json.dumps),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(LINES, max_size=8))
def test_a_task_file_costs_one_problem_per_bad_line(tmp_path_factory, lines):
    lines = [ln.replace("\n", " ").replace("\r", " ") for ln in lines]
    path = tmp_path_factory.mktemp("tasks") / "t.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    tasks, problems = load_tasks(path, "mcp:x")
    text_lines = path.read_text(encoding="utf-8").splitlines()
    assert len(tasks) + len(problems) == sum(1 for ln in text_lines if ln.strip())
    assert len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.env_record() == {"name": "mcp:x", "state": {"files": t.files}}


def test_task_fields_are_checked():
    ok = parse_task({"id": "a", "state": {"files": {"d/x.txt": "1"}},
                     "ground_truth": [["t", {"k": 1}]], "split": "dev"}, "mcp:x")
    assert ok.calls() == [("t", {"k": 1})] and ok.split == "dev"
    for raw, why in [({"id": ""}, "id"), ({"id": "a", "split": "val"}, "split"),
                     ({"id": "a", "ground_truth": [["t"]]}, "ground_truth"),
                     ({"id": "a", "command": "rm"}, "unknown field"),
                     ({"id": "a", "state": {"files": {"../x": ""}}}, "plain relative"),
                     ({"id": "a", "state": {"shell": "x"}}, "only 'files'")]:
        with pytest.raises(ValueError, match=why):
            parse_task(raw, "mcp:x")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "/", "\\", "c.txt"]), min_size=1,
                max_size=5).map("/".join))
def test_no_state_path_leaves_the_workdir(path):
    try:
        files = check_files({path: "x"})
    except StateError:
        return
    parts = path.split("/")
    assert ".." not in parts and "." not in parts and "" not in parts
    assert list(files) == [path] and not path.startswith("/")


def test_state_round_trips_and_ignores(tmp_path):
    files = {"a.txt": "x", "d/e/f.json": "{}", ".git/index": "stat times", ".git/HEAD": "ref"}
    write_files(tmp_path, files)
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    state = read_state(tmp_path, ignore=(".git/index",))
    binary = {"sha256": hashlib.sha256(b"\xff\xfe").hexdigest(), "bytes": 2}
    assert state["files"] == {".git/HEAD": "ref", "a.txt": "x", "bin": binary,
                              "d/e/f.json": "{}"}
    assert list(read_state(tmp_path, ignore=(".git",))["files"]) == ["a.txt", "bin", "d/e/f.json"]


def _result(*blocks, **kw) -> types.CallToolResult:
    return types.CallToolResult(content=list(blocks), **kw)


def test_response_text_of_every_content_block():
    png = base64.b64encode(b"\x89PNG....").decode()
    r = _result(types.TextContent(text="one"), types.TextContent(text="two in /w/x"),
                types.ImageContent(data=png, mime_type="image/png"),
                types.AudioContent(data="!!", mime_type="audio/wav"),
                types.ResourceLink(uri="file:///w/a.txt", name="a"),
                types.EmbeddedResource(resource=types.TextResourceContents(
                    uri="mem://n", mime_type="text/plain", text="body")))
    lines = result_text(r, workdir="/w").split("\n")
    assert lines[0] == "one" and lines[1] == "two in {workdir}/x"
    assert lines[2].startswith("[image image/png, 8 bytes, sha256 ")
    assert lines[3].startswith("[audio audio/wav, 2 characters, not base64, sha256 ")
    assert lines[4] == "[resource link file://{workdir}/a.txt (a)]"
    assert lines[5:] == ["[resource mem://n text/plain]", "body"]
    assert result_text(_result(structured_content={"b": 1, "a": 2})) == '{"a": 2, "b": 1}'
    assert canonical_text("at 12:34:56 id 7f", None, (r"\d\d:\d\d:\d\d",)) == \
        "at <volatile> id 7f"
    assert fill_workdir({"p": ["{workdir}/a", 1]}, "/w") == {"p": ["/w/a", 1]}


def test_the_test_config_is_valid():
    assert set(load_config(CONFIG)) == {"ledger", "git", "memory", "files"}
    assert Path(CONFIG).is_file()
