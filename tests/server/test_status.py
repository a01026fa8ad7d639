"""/ws/status and the /status page, with a WebSocket client and a real headless Chromium."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
from websockets.sync.client import connect

from helpers import host_gpus, wait_until

KEYS = {"timestamp", "gpu", "loaded_models", "server", "gpus", "models", "counters", "histograms"}


def test_ws_status_sends_the_status_object_every_200_ms(example_server) -> None:
    with connect(f"ws://{example_server.http_url}/ws/status") as ws:
        messages = [json.loads(ws.recv(timeout=30)) for _ in range(6)]
    # the cadence from the server's own timestamps: never a flood, and a message every 200 ms or
    # so (the median gap allows for a loaded machine)
    gaps = sorted(b["timestamp"] - a["timestamp"] for a, b in zip(messages, messages[1:], strict=False))
    assert gaps[0] >= 0.15 and gaps[len(gaps) // 2] < 1.0, gaps
    status = messages[-1]
    assert KEYS <= set(status)
    assert {"version", "uptime_seconds", "user", "working_dir", "pid"} <= set(status["server"])
    gpus = host_gpus()  # NVML's list on GPU hosts, empty on CPU hosts
    assert len(status["gpus"]) == gpus and status["gpu"] == ("cuda" if gpus else "")
    assert "simple" in status["loaded_models"]
    simple = next(m for m in status["models"] if m["name"] == "simple")
    assert simple["state"] == "loaded" and simple["versions"] == {"1": "READY"}
    assert simple["device"] == ("cuda:0" if gpus else "cpu")
    assert "nv_inference_request_success" in status["counters"]


class DevTools:
    """Chromium's DevTools protocol over its WebSocket: enough to load a page, evaluate and screenshot."""

    def __init__(self, tmp_path) -> None:
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        assert browser, "chromium is needed: `make test` installs it (Debian package chromium)"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", f"--remote-debugging-port={port}", "--window-size=1200,700",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as reply:
                    pages = [p for p in json.load(reply) if p["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "chromium did not start"
            time.sleep(0.2)
        self.url = pages[0]["webSocketDebuggerUrl"]
        self.ws = None  # set while a `with connect(self.url) as ws` block is open
        self.next_id = 0

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=30))
            if reply.get("id") == self.next_id:
                assert "error" not in reply, reply
                return reply["result"]

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def test_status_page_shows_models_and_a_chart_that_updates(example_server, tmp_path) -> None:
    stop = threading.Event()

    def traffic() -> None:
        with grpcclient.InferenceServerClient(example_server.url) as client:
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
            while not stop.is_set():
                client.infer("simple", inputs)

    browser = DevTools(tmp_path)  # before the traffic starts: a browser that fails to start stops no thread
    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        with connect(browser.url, max_size=2**26) as browser.ws:
            browser.call("Page.navigate", url=f"http://{example_server.http_url}/status")
            updates = "Number(document.body.dataset.updates) || 0"
            # the page has drawn the traffic: a non-zero rate (it counts the requests of its last updates)
            wait_until(lambda: browser.evaluate("Number(document.getElementById('rps').textContent) > 0"),
                       "the page to show a request rate above zero")
            first, first_updates = browser.screenshot(), browser.evaluate(updates)
            wait_until(lambda: browser.evaluate(updates) >= first_updates + 5, "five more updates of the page")
            second, second_updates = browser.screenshot(), browser.evaluate(updates)
            rows = browser.evaluate("[...document.querySelectorAll('#models tr')].map(r => r.innerText)")
    finally:
        browser.close()
        stop.set()
        worker.join(timeout=30)
    assert first[:8] == b"\x89PNG\r\n\x1a\n" and len(first) > 20_000
    assert first != second, "the page did not change while traffic flowed"
    assert second_updates >= first_updates + 5, (first_updates, second_updates)
    assert any(row.startswith("simple\tloaded") for row in rows), rows
