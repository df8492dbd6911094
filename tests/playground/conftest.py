import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_playground(runs, *options: str):
    """`burnout playground RUN … OPTIONS` on a free loopback port; yields (url, process)."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "burnout", "playground", *map(str, runs), "--port", str(port),
                             *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 90
    try:
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the playground did not start:\n{proc.communicate(timeout=10)[0]}")
                time.sleep(0.5)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def start_playground():
    """The `running_playground` context manager, for tests in this folder."""
    return running_playground
