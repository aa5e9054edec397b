"""The API's OpenAPI schema, fuzzed with schemathesis: whatever a client sends, the answer is
never a 5xx (bad input is a 4xx with a JSON error naming the problem)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tether as tt  # noqa: E402
from tether.web.server import ServerConfig, create_app  # noqa: E402

_DIR = Path(tempfile.mkdtemp(prefix="tether-schema-"))
harness = tt.Harness(f"sqlite:///{_DIR / 'schema.db'}")


@harness.agent("echo")
class Echo(tt.Agent):
    async def plan(self, t: tt.TaskView) -> tt.Action:
        return tt.Finish(t.input)


TOKEN = "operator-token-0123456789abcdef"
app = create_app(harness, ServerConfig({TOKEN: "operator"}, {"billing": "billing-secret-0123456789"}))
# the schema itself needs a read token now (issue 13)
schema = schemathesis.openapi.from_asgi("/openapi.json", app,
                                        headers={"Authorization": f"Bearer {TOKEN}"})


MODES = list(schema.config.generation.modes)
OPERATIONS = [found.ok() for found in schema.get_all_operations()]
"""Every operation of the schema, a test each: each has its own id, so a run split over
processes (pytest-xdist) runs and counts every one (schemathesis's own ``parametrize`` gives
them one shared id, which such a run counts, and schedules, as one test)."""


def test_the_schema_has_every_route() -> None:
    assert len(OPERATIONS) >= 20
    assert len({op.label for op in OPERATIONS}) == len(OPERATIONS)


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_request_gets_a_server_error(operation: Any, data: st.DataObject) -> None:
    mode = data.draw(st.sampled_from(MODES))  # valid requests and invalid ones, as schemathesis
    case = data.draw(operation.as_strategy(mode))
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"
    if response.status_code >= 400:
        assert isinstance(response.json()["error"], str)
