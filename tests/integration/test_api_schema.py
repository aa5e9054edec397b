"""The API's OpenAPI schema, fuzzed with schemathesis: whatever a client sends, the answer is
never a 5xx (bad input is a 4xx with a JSON error naming the problem)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed")
from hypothesis import HealthCheck, settings  # noqa: E402

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


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case) -> None:  # type: ignore[no-untyped-def]
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"
    if response.status_code >= 400:
        assert isinstance(response.json()["error"], str)
