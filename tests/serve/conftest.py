"""Fixtures for the `geist serve` tests: servers started on 127.0.0.1 on free ports.

GEIST_BIN names the geist binary (default build/release/tools/geist); GEIST_MODEL the
default model (default ~/.cache/geist/models/gemma-3-270m-q4_k_m.gguf). A binary built
without the HTTP server, a missing model or a missing `openai` module makes the tests SKIP
with the reason; with GEIST_SERVE_REQUIRED=1 (scripts/test.sh sets it where
libcpp-httplib-dev is installed) each of those FAILS instead, so that CI cannot pass
without testing the server."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("GEIST_BIN", ROOT / "build/release/tools/geist"))
MODEL = pathlib.Path(os.environ.get("GEIST_MODEL", pathlib.Path.home() / ".cache/geist/models/gemma-3-270m-q4_k_m.gguf"))
TINY = ROOT / "tests/data/tiny_gemma3.gguf"
API_KEY = "test-key-123"
SERVE_REQUIRED = os.environ.get("GEIST_SERVE_REQUIRED") == "1"


def skip_or_fail(reason, required=SERVE_REQUIRED, flag="GEIST_SERVE_REQUIRED"):
    """SKIP with the reason; FAIL instead where `flag`=1 says the capability must be here."""
    if required:
        pytest.fail(f"{reason.removeprefix('SKIP: ')}; {flag}=1 says it must be here (scripts/test.sh "
                    "sets it from the installed packages)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_or_skip(module, required=SERVE_REQUIRED, flag="GEIST_SERVE_REQUIRED"):
    """The module, or SKIP (FAIL where `flag`=1) when it cannot be imported."""
    try:
        return __import__(module)
    except ImportError as e:
        skip_or_fail(f"SKIP: no {module} module ({e}; scripts/test.sh installs it into build/pydeps)",
                     required, flag)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None, timeout=60):
    """(status, headers, body bytes) of one request; HTTP errors are returned, not raised."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class Server:
    def __init__(self, args, model, log):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.log = open(log, "wb")
        cmd = [str(BIN), "serve", "-m", str(model), "--port", str(self.port)] + args
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"geist serve exited with {self.proc.returncode}: {self.output()}")
            try:
                if http("GET", self.url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("geist serve did not become ready in 120 s: " + self.output())

    def output(self):
        self.log.flush()
        return pathlib.Path(self.log_path).read_text(errors="replace")

    def metrics(self, headers=None):
        status, _, body = http("GET", self.url + "/metrics", headers=headers)
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _check_binary():
    if not BIN.exists():
        skip_or_fail(f"SKIP: no geist binary at {BIN} (build it, or set GEIST_BIN)")
    probe = subprocess.run([str(BIN), "serve", "-m", "/nonexistent.gguf", "--port", "1"], capture_output=True,
                           text=True, timeout=60)
    if "no HTTP server" in probe.stderr:
        skip_or_fail("SKIP: this geist was built without cpp-httplib, so it has no server")


@pytest.fixture(scope="session")
def start_server(tmp_path_factory):
    """start_server(args, model=MODEL) -> Server; every server is stopped at the end."""
    _check_binary()
    servers = []

    def start(args, model=MODEL):
        if not pathlib.Path(model).exists():
            skip_or_fail(f"SKIP: model {model} is missing (python3 scripts/fetch_model.py)")
        s = Server(args, model, tmp_path_factory.mktemp("serve") / "server.log")
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def srv(start_server):
    """The default model, two slots, an API key."""
    return start_server(["-c", "2048", "--parallel", "2", "--api-key", API_KEY, "-q"])


@pytest.fixture(scope="session")
def client(srv):
    openai = import_or_skip("openai")
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def auth():
    return {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
