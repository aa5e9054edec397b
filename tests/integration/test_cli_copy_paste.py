"""The command line and the README as a new user meets them (issue 18, part 3).

Each test is one thing a person tried by copying a command: an unknown id, a store URL that
names no server, a folder without a store, a bad option, a task waiting for a time, an event
type the protocol does not list, a missing input, and the README's own commands.
"""

from __future__ import annotations

import ast
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import services
from tether.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CLI_SOURCES = [ROOT / "src" / "tether" / "cli" / name
               for name in ("main.py", "app.py", "render.py", "levers.py", "integrity.py")]
REQUIREMENT_CODE = re.compile(r"\b[RE]\d{1,2}\b")

DUE_APP = '''
import tether as tt

harness = tt.Harness(settings=tt.Settings(recovery_backoff=600, poll_interval=0.05))


@harness.agent("waiter")
class Waiter(tt.Agent):
    async def plan(self, task):
        return tt.Finish(1) if task.last_event else tt.Wait("approval", timeout=3600)


@harness.agent("planner")
class Planner(tt.Agent):
    async def plan(self, task):
        raise RuntimeError("the model is down")


@harness.tool(idempotent=True, retry=tt.RetryPolicy(max_attempts=3, backoff=600, max_backoff=600))
async def fetch(ctx: tt.ToolContext) -> int:
    raise ConnectionError("upstream answered 503")


@harness.agent("caller")
class Caller(tt.Agent):
    async def plan(self, task):
        return tt.ToolCall("fetch", {})


@harness.agent("needy")
class Needy(tt.Agent):
    input_required = True

    async def plan(self, task):
        return tt.Finish(task.input["n"])
'''


def run(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store file in its own folder (the current one), named by TETHER_STORE."""
    db = tmp_path / "cli.db"
    monkeypatch.setenv("TETHER_STORE", f"sqlite:///{db}")
    monkeypatch.setenv("TETHER_DEMO_LEDGER", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("TETHER_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    return db


@pytest.fixture
def app(store: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An app of agents that wait for a time, back off, or need an input (its own module
    name, so no other test's import is reused)."""
    name = f"dueapp_{uuid.uuid4().hex[:8]}"
    (store.parent / f"{name}.py").write_text(DUE_APP)
    monkeypatch.setenv("TETHER_APP", f"{name}:harness")
    return name


def one_error_line(result: Result) -> str:
    out = result.output
    assert out.startswith("error: ") and out.count("\n") == 1, out
    return out


# ---------------------------------------------------------------------- errors and stores


def test_versions_of_an_unknown_task_is_an_error_like_show(store: Path) -> None:
    run("submit", "inventory")
    for command in ("versions", "show"):
        out = one_error_line(run(command, "nope", code=1))
        assert "no task 'nope'" in out
    one_error_line(run("versions", "nope", "--json", code=1))


@pytest.mark.parametrize("command", [["ls"], ["show", "t1"], ["history", "t1"],
                                     ["versions", "t1"], ["export", "t1", "-o", "b.json"],
                                     ["ls", "--json"]])
def test_reading_in_a_folder_without_a_store_says_so_and_creates_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    """The default store is not created by a command that only reads (a store named with
    --store or TETHER_STORE is opened as named, empty if new)."""
    monkeypatch.delenv("TETHER_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    out = one_error_line(run(*command, code=1))
    assert "no store here: 'tether.db', the default store, does not exist" in out
    assert "--store" in out and not (tmp_path / "tether.db").exists()


def test_writing_commands_still_create_the_default_store(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    task_id = run("submit", "inventory").stdout.strip()
    assert (tmp_path / "tether.db").exists()
    assert [t["task_id"] for t in json.loads(run("ls", "--json").stdout)] == [task_id]


def _postgres_server() -> str:
    """The test PostgreSQL server's admin URL (the test skips, or fails under CI, without)."""
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(services.PG_ADMIN_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        services.unavailable(f"PostgreSQL at {services.PG_ADMIN_URL}", exc, services.PG_FIX)
    return services.PG_ADMIN_URL


@pytest.mark.parametrize("command", [["ls"], ["show", "t1"], ["versions", "t1"],
                                     ["submit", "inventory"], ["migrate"],
                                     ["worker", "--until-idle"],
                                     ["serve", "--tokens", "0123456789abcdef0123:read"]])
def test_an_unknown_postgres_database_is_one_line_naming_it(store: Path,
                                                            command: list[str]) -> None:
    """Every command, the worker and the server too: one line, the server's own reason once,
    no pool chatter (it used to take 10 s and print the same error four times)."""
    url = _postgres_server().rpartition("/")[0] + "/nope_db_tether"
    result = run("--store", url, *command, code=1)
    out = one_error_line(result)  # no banner before it, no pool chatter after it
    assert out.count('database "nope_db_tether" does not exist') == 1, out


@pytest.mark.parametrize("command", [["ls"], ["show", "t1"], ["submit", "inventory"]])
def test_a_refused_postgres_port_is_one_line_naming_it(store: Path, command: list[str]) -> None:
    pytest.importorskip("psycopg")
    out = one_error_line(run("--store", "postgresql://postgres@127.0.0.1:1/test", *command,
                             code=1))
    assert out.count("Connection refused") == 1 and "port 1" in out, out


def test_an_unreachable_cache_is_one_warning_on_stderr(store: Path) -> None:
    """A Redis that does not answer is said once on stderr; the command works from the store.
    A real process: the cache's own log line would reach stderr too, so it is counted."""
    pytest.importorskip("redis")
    task_id = run("submit", "report", "--input", '{"report": "FY25"}').stdout.strip()
    env = {**os.environ, "TETHER_CACHE": "redis://127.0.0.1:1/0"}
    for command in (["ls"], ["show", task_id]):
        done = subprocess.run([sys.executable, "-m", "tether", *command], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("Redis") == 1, done.stderr
        assert done.stderr.startswith("warning: the Redis cache redis://127.0.0.1:1/0 does not"
                                      " answer"), done.stderr
        assert task_id in done.stdout
    quiet = subprocess.run([sys.executable, "-m", "tether", "ls"], capture_output=True,
                           text=True, timeout=60, check=False,
                           env={k: v for k, v in env.items() if k != "TETHER_CACHE"})
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


# ---------------------------------------------------------------------- options


@pytest.mark.parametrize("command", [
    ["worker", "--concurrency", "0", "--until-idle"],
    ["serve", "--concurrency", "0", "--tokens", "0123456789abcdef0123:read"],
    ["serve", "--port", "70000", "--tokens", "0123456789abcdef0123:read"],
    ["torture", "tether.examples:demo_app", "inventory", "--seeds", "0"],
    ["submit", "inventory", "--deadline", "2026-12-01T09:00"],
    ["submit", "inventory", "--not-before", "-5"],
    ["submit", "report", "--input", "{not json"],
    ["emit", "t1", "user_message", "--payload", "{not json"],
    ["resume", "t1", "--patch", "[1, 2]"],
    ["rollback", "t1", "--to", "0"],
])
def test_options_are_checked_before_anything_is_printed_or_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.delenv("TETHER_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    result = run(*command, code=2)
    assert result.stdout == "", result.stdout
    assert result.stderr.startswith("Usage: ") and "Error: " in result.stderr, result.stderr
    assert "serving" not in result.output
    assert not (tmp_path / "tether.db").exists()


def test_a_naive_time_is_refused_in_the_command_lines_words(store: Path) -> None:
    err = run("submit", "inventory", "--deadline", "2026-12-01T09:00", code=2).stderr
    assert "--deadline '2026-12-01T09:00' has no time zone" in err and "+00:00" in err
    assert "datetime" not in err


# ---------------------------------------------------------------------- show and ls


def test_show_names_the_due_time_each_task_waits_for(app: str) -> None:
    waiting = run("submit", "waiter").stdout.strip()
    deadline = run("submit", "waiter", "--deadline", "60").stdout.strip()
    scheduled = run("submit", "waiter", "--not-before", "600").stdout.strip()
    replanning = run("submit", "planner").stdout.strip()
    retrying = run("submit", "caller").stdout.strip()
    run("worker", "--until-idle")
    expected = {
        waiting: "the timeout of its wait for approval (a timer)",
        deadline: "its deadline (--deadline)",
        scheduled: "its scheduled start (--not-before)",
        replanning: "the back-off before the agent plans again (recovery 1)",
        retrying: "the back-off before fetch is tried again",
    }
    for task_id, reason in expected.items():
        out = run("show", task_id).stdout
        due = [line for line in out.splitlines() if line.startswith("due for a look at ")]
        assert len(due) == 1 and due[0].endswith(f": {reason}"), out
        assert "(a timer, deadline, scheduled start or back-off)" not in out
    shown = " ".join(run("show", waiting).stdout.split())
    assert "waiting for: an approval event, until " in shown  # what it waits for, and when
    assert f"`tether emit {waiting} approval --payload JSON` sends one" in shown


def test_ls_fits_80_columns_and_never_cuts_ids_or_statuses(store: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    parked = run("submit", "inventory").stdout.strip()
    done = run("submit", "compare_history", "--input", '{"report": "FY25"}').stdout.strip()
    run("worker", "--until-idle")
    monkeypatch.setenv("COLUMNS", "80")
    lines = run("ls").stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "needs_human" in rows[parked].split() and "fetch_inventory" in rows[parked]
    assert "completed" in rows[done].split()
    assert len(lines) == 3  # one line per task: the reason is cut, not wrapped


# ---------------------------------------------------------------------- emit, submit, resume


def test_emit_errors_speak_the_command_line(store: Path) -> None:
    task_id = run("submit", "inventory").stdout.strip()
    out = one_error_line(run("emit", task_id, "made_up", code=1))
    assert "--priority" in out and "priority=" not in out
    assert "stored" in run("emit", task_id, "made_up", "--priority", "2").stdout
    out = one_error_line(run("emit", task_id, "cancel", code=1))
    assert "`tether cancel`" in out and "harness's" not in out
    out = one_error_line(run("emit", task_id, "timer", code=1))
    assert "timer" in out and "priority=" not in out


def test_submit_without_input_for_an_agent_that_needs_one_is_refused_at_once(
        app: str, store: Path) -> None:
    result = run("submit", "needy", code=2)
    assert "agent 'needy' needs an input: give --input JSON" in result.stderr
    assert not store.exists()  # refused before the store was opened
    task_id = run("submit", "needy", "--input", '{"n": 3}').stdout.strip()
    run("worker", "--until-idle")
    assert json.loads(run("show", task_id, "--json").stdout)["snapshot"]["result"] == 3
    assert run("submit", "waiter").stdout.strip()  # an agent that declares nothing is free


CHARGE_APP = '''
import os
import tether as tt

harness = tt.Harness(settings=tt.Settings(recovery_backoff=0.01, poll_interval=0.05))


@harness.tool(side_effect=True)
async def charge(ctx: tt.ToolContext, cents: int) -> str:
    with open(os.environ["CHARGES"], "a") as ledger:
        ledger.write(f"{ctx.idempotency_key} {cents}\\n")
    return "charged"


@harness.agent("invoice")
class Invoice(tt.Agent):
    async def plan(self, task):
        if task.step == 0:
            return tt.ToolCall("charge", {"cents": 500})
        return tt.Finish(f"mailed to {task.input['email']}")
'''


def test_resume_with_input_repairs_a_task_without_repeating_what_it_did(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task charged a card, then stopped on a wrong input (no 'email'). `resume --input`
    replaces the input; the task finishes with it, and the card was charged once."""
    name = f"chargeapp_{uuid.uuid4().hex[:8]}"
    (store.parent / f"{name}.py").write_text(CHARGE_APP)
    monkeypatch.setenv("TETHER_APP", f"{name}:harness")
    charges = store.parent / "charges.txt"
    monkeypatch.setenv("CHARGES", str(charges))
    task_id = run("submit", "invoice", "--input", '{"mail": "a@example.com"}').stdout.strip()
    run("worker", "--until-idle")
    stuck = json.loads(run("show", task_id, "--json").stdout)
    assert stuck["snapshot"]["status"] == "needs_human" and "email" in stuck["reason"]
    bad = run("resume", task_id, "--input", "{email", code=2)
    assert "--input is not valid JSON" in bad.stderr
    run("resume", task_id, "--input", '{"email": "a@example.com"}')
    run("worker", "--until-idle")
    done = json.loads(run("show", task_id, "--json").stdout)["snapshot"]
    assert done["status"] == "completed" and done["result"] == "mailed to a@example.com"
    assert done["input"] == {"email": "a@example.com"}
    assert len(charges.read_text().splitlines()) == 1  # the charge was not made again
    rows = json.loads(run("history", task_id, "--json").stdout)
    replaced = [r for r in rows if r.get("type") == "input"]
    assert replaced and replaced[0]["replaced"] == {"mail": "a@example.com"}
    assert "--input" in " ".join(run("resume", "--help").stdout.split())
    assert "resume ID --input JSON" in " ".join(run("submit", "--help").stdout.split())


# ---------------------------------------------------------------------- what users read


def _help_texts() -> dict[str, str]:
    texts = {"tether": run("--help").stdout}
    for name in main.commands:
        texts[name] = run(name, "--help").stdout
    return texts


def test_no_requirement_codes_in_help_or_in_the_cli_s_messages() -> None:
    for name, text in _help_texts().items():
        assert not REQUIREMENT_CODE.search(text), (name, text)
    for path in CLI_SOURCES:
        for text in _message_strings(ast.parse(path.read_text())):
            assert not REQUIREMENT_CODE.search(text), (path.name, text)


def _message_strings(tree: ast.Module) -> list[str]:
    """The string constants of a module that are not docstrings of the module or of helper
    functions (command docstrings are help, checked through --help)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef
                                | ast.ClassDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_demo_help_matches_the_readme() -> None:
    text = " ".join(run("demo", "--help").stdout.split())
    assert "four scenarios" in text and "three kinds" not in text
    assert "runs four example tasks" in README


def test_the_demo_prints_the_tree_with_its_root_and_only_paths_that_exist(tmp_path: Path) -> None:
    for keep in (False, True):
        done = subprocess.run([sys.executable, "-m", "tether", "demo", *(["--keep"] * keep)],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**os.environ, "COLUMNS": "200"}, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout + done.stderr
        lines = [line.strip() for line in out.splitlines()]
        root = lines.index("report")
        assert lines[root + 1] == "├── extract_metrics", out
        assert "│   └── prior_year" in lines and "└── write_summary" in lines
        paths = re.findall(r"(/\S*tether-demo-\S+)", out)
        assert all(Path(p).exists() for p in paths), paths
        bundles = [p for p in paths if p.endswith(".json")]
        assert len(bundles) == int(keep), out
        if keep:
            assert json.loads(Path(bundles[0]).read_text())["task"]["status"] == "needs_human"
            shutil.rmtree(Path(bundles[0]).parents[1])


def _readme_block(after: str, fence: str) -> str:
    start = README.index(fence, README.index(after)) + len(fence)
    return README[start: README.index("```", start)]


def test_the_readme_cli_block_lists_every_command() -> None:
    block = _readme_block("## CLI", "```\n")
    listed = set(re.findall(r"(?:^ {2}|\s{2,})([a-z]+)(?= |\n)", block, re.M))
    assert set(main.commands) <= listed, sorted(set(main.commands) - listed)


def test_the_readme_install_lines_are_from_source() -> None:
    block = _readme_block("# tether", "```bash\n")
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert commands and all("pip install -e " in line for line in commands), commands
    assert "clone" in block


def test_the_readme_test_paragraph_says_what_it_installs_and_how_long() -> None:
    tests = " ".join(README[README.index("## Tests"):README.index("## Performance")].split())
    for needed in ("Chromium", "apt-get", ".bench-venv", "~/.cache/tether-llama",
                   "about ten minutes"):
        assert needed in tests, needed
    assert re.search(r"a whole run takes \d+ to \d+ minutes on two cores", tests)


def test_the_readme_llm_example_runs_against_the_fake_server_as_written(tmp_path: Path) -> None:
    """The example saved as support.py and the README's command for the fake server, run as a
    person would (the venv's python is this one): it prints the status and the answer."""
    (tmp_path / "support.py").write_text(_readme_block("## An LLM agent", "```python\n"))
    commands = _readme_block("Save it as `support.py`", "```bash\n")
    fake = commands[commands.index(".venv/bin/python -c"):]
    done = subprocess.run(["bash", "-c", fake.replace(".venv/bin/python", sys.executable)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if not k.startswith("OPENAI")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed: Refunded 5 EUR on order A1.", done.stdout


def test_the_readme_llm_example_asks_for_the_model_in_openai_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openai")
    from tether.testing.fake_openai import FakeOpenAI, reply

    example = tmp_path / "support.py"
    example.write_text(_readme_block("## An LLM agent", "```python\n"))
    monkeypatch.chdir(tmp_path)
    with FakeOpenAI([reply("Nothing to refund.")]) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
        monkeypatch.setenv("OPENAI_API_KEY", "none")
        monkeypatch.setenv("OPENAI_MODEL", "my-local-model")
        runpy.run_path(str(example), run_name="__main__")
        assert [r["model"] for r in fake.requests] == ["my-local-model"]
    assert capsys.readouterr().out == "completed: Nothing to refund.\n"


def test_serve_on_a_port_in_use_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    """Issue 29: not uvicorn's 54-line traceback: one line that says what to do, exit 1."""
    import socket

    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("--store", f"sqlite:///{tmp_path / 's.db'}", "serve", "--port", str(port),
                     "--tokens", "0123456789abcdef0123:read", code=1)
    said = [line for line in result.output.strip().splitlines() if line.strip()]
    assert said == [
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; another server has"
        " that port: stop it, or choose another with --port"], said
