"""The playground's limits as configured by `serve`: the queue's bound and concurrency, the loopback default
bind, and no uploads (through the real command: Gradio's upload route would store any file and answer with its
server path)."""

import gradio as gr
import httpx
import pytest

from burnout.playground import app


def test_serve_bounds_the_queue_and_listens_on_loopback_by_default(sampled_runs, monkeypatch):
    launched = {}

    def fake_launch(self, **kwargs):
        launched.update(kwargs, blocks=self)

    monkeypatch.setattr(gr.Blocks, "launch", fake_launch)
    app.serve(sampled_runs, concurrency=3, queue_size=7)
    queue = launched["blocks"]._queue
    assert (queue.max_size, queue.default_concurrency_limit) == (7, 3)
    assert launched["server_name"] == "127.0.0.1" and launched["max_file_size"] == 0
    assert [m.cls for m in launched["app_kwargs"]["middleware"]] == [app.RefuseUploads]


@pytest.mark.slow
def test_uploads_are_refused_without_a_path(sampled_runs, start_playground):
    with start_playground(sampled_runs) as (url, proc):
        answer = httpx.post(f"{url}gradio_api/upload", files={"files": ("x.bin", b"\0" * 1_000_000)}, timeout=30)
        assert answer.status_code == 403 and "/" not in answer.text
        assert httpx.get(url, timeout=30).status_code == 200  # the app itself still answers
        assert proc.poll() is None
