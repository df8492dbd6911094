"""The playground under load: 100 requests from 20 concurrent clients on loopback. Every request is
answered or cleanly refused (the queue is full), the bound does refuse some, and the server still answers
afterwards."""

import concurrent.futures
import threading

import pytest
from gradio_client import Client

pytestmark = pytest.mark.slow  # every test here trains, installs or drives a browser: not in `make test-fast`

CLIENTS, REQUESTS_PER_CLIENT = 20, 5
# max new tokens, temperature, top-k, top-p, repetition penalty: 32 tokens keep the 2 running requests busy while
# the other clients' first requests arrive.
SETTINGS = (32, 0.8, 50, 1.0, 1.0)


def test_hundred_requests_from_twenty_clients(sampled_runs, start_playground):
    # A queue smaller than the number of clients, so that some requests must be refused.
    with start_playground(sampled_runs, "--concurrency", "2", "--queue-size", "8") as (url, proc):
        checkpoint = "fast · step 24"
        outcomes = []
        lock = threading.Lock()
        together = threading.Barrier(CLIENTS)

        def client_session(i: int) -> None:
            client = Client(url, verbose=False)
            together.wait(timeout=120)  # the first requests all at once: more than the queue and workers hold
            for j in range(REQUESTS_PER_CLIENT):
                try:
                    text = client.predict(checkpoint, f"The {i}-{j}", *SETTINGS, api_name="/generate")
                    result = ("answered", text)
                except Exception as exc:  # the client raises on refusal; the message says why
                    result = ("refused", str(exc))
                with lock:
                    outcomes.append(result)

        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            for future in [pool.submit(client_session, i) for i in range(CLIENTS)]:
                future.result(timeout=300)

        assert len(outcomes) == CLIENTS * REQUESTS_PER_CLIENT
        answered = [text for kind, text in outcomes if kind == "answered"]
        refused = [message for kind, message in outcomes if kind == "refused"]
        for text in answered:
            assert text.startswith("The ")
        unclean = [m for m in refused if "queue" not in m.lower() and "full" not in m.lower()]
        assert not unclean, unclean[:3]
        assert answered, "no request was answered"
        assert refused, "20 requests at once, 2 running and 8 waiting, yet none was refused: is the queue bounded?"

        # Healthy afterwards: the process runs and a fresh request is answered.
        assert proc.poll() is None
        after = Client(url, verbose=False).predict(checkpoint, "The end", *SETTINGS, api_name="/generate")
        assert after.startswith("The end")
        print(f"{len(answered)} answered, {len(refused)} refused (queue full): {refused[:1]}")
