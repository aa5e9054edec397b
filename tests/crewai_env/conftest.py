"""CrewAI's telemetry and tracing are off in these tests: nothing leaves the machine. Set
only where CrewAI is installed (its own environment), before any test module imports it:
elsewhere this folder's tests are skipped, and the rest of the suite is left as it is."""

import importlib.util
import os

if importlib.util.find_spec("crewai") is not None:
    os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
