"""/ws/status (the status object every 200 ms) and /status (a page that draws it live).

The page is plain HTML and JavaScript with no external assets: a table of models and their
states, and two small canvas charts - requests per second and mean latency over the last five
minutes - computed from the counters in each status message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect

INTERVAL_SECS = 0.2


def status_socket(snapshot: Callable[[], Awaitable[dict[str, Any]]]) -> Callable[[WebSocket], Awaitable[None]]:
    """The /ws/status endpoint: sends ``await snapshot()`` (``kserve_v2.observability.status.StatusReporter``'s
    object, of every replica with ``--workers``) every 200 ms until the client leaves."""

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                await websocket.send_json(await snapshot())
                await asyncio.sleep(INTERVAL_SECS)
        except (WebSocketDisconnect, OSError, RuntimeError):
            return  # the client went away, or the server is shutting down

    return endpoint


async def status_page(_: Request) -> Response:
    """GET /status."""
    return HTMLResponse(PAGE)


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>kserve_v2 status</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
 h1 { font-size: 20px; margin: 0 0 4px; } .muted { color: #777; }
 table { border-collapse: collapse; margin: 16px 0; } td, th { padding: 4px 12px; border-bottom: 1px solid #ddd; text-align: left; }
 .loaded { color: #19803a; font-weight: 600; } .loading, .unloading { color: #b36b00; } .available { color: #888; }
 .charts { display: flex; gap: 24px; flex-wrap: wrap; } figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 4px; }
 canvas { border: 1px solid #ccc; background: #fafafa; }
</style></head>
<body data-updates="0">
<h1>kserve_v2</h1><div class="muted" id="server">connecting...</div>
<table><thead><tr><th>model</th><th>state</th><th>versions</th><th>device</th><th>in flight</th></tr></thead>
<tbody id="models"></tbody></table>
<div class="charts">
 <figure><figcaption>requests / s <span id="rps" class="muted"></span></figcaption><canvas id="rate" width="520" height="160"></canvas></figure>
 <figure><figcaption>mean latency, ms <span id="lat" class="muted"></span></figcaption><canvas id="latency" width="520" height="160"></canvas></figure>
</div>
<script>
const WINDOW_MS = 5 * 60 * 1000;
const points = [];
let previous = null, updates = 0;
function total(family) {
  let sum = 0;
  for (const sample of family || []) sum += sample.value;
  return sum;
}
function latencyTotals(status) {
  let count = 0, sum = 0;
  for (const h of (status.histograms || {})["nv_inference_request_latency_seconds"] || []) { count += h.count || 0; sum += h.sum || 0; }
  return [count, sum];
}
function draw(id, key, color) {
  const canvas = document.getElementById(id), ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const now = Date.now(), max = Math.max(1e-9, ...points.map(p => p[key]));
  ctx.strokeStyle = "#e4e4e4"; ctx.beginPath();
  for (let i = 1; i < 4; i++) { const y = canvas.height * i / 4; ctx.moveTo(0, y); ctx.lineTo(canvas.width, y); }
  ctx.stroke();
  ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
  points.forEach((p, i) => {
    const x = canvas.width * (1 - (now - p.t) / WINDOW_MS), y = canvas.height - 4 - (canvas.height - 8) * p[key] / max;
    i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#555"; ctx.fillText(max.toFixed(max < 10 ? 2 : 0), 4, 12);
}
function render(status) {
  const s = status.server;
  document.getElementById("server").textContent =
    `version ${s.version} - pid ${s.pid} - up ${s.uptime_seconds} s - ${status.gpus.length ? status.gpus.length + " GPU" : "CPU only"}`;
  document.getElementById("models").innerHTML = status.models.map(m =>
    `<tr><td>${m.name}</td><td class="${m.state}">${m.state}</td><td>${Object.entries(m.versions).map(([v, st]) => v + ": " + st).join(", ")}</td>` +
    `<td>${m.device || ""}</td><td>${m.queue_depth}</td></tr>`).join("");
  const t = status.timestamp * 1000, done = total(status.counters["nv_inference_request_success"]);
  const [count, sum] = latencyTotals(status);
  if (previous) {
    const dt = (t - previous.t) / 1000, dc = count - previous.count;
    points.push({t, rate: Math.max(0, (done - previous.done) / dt), latency: dc > 0 ? 1000 * (sum - previous.sum) / dc : 0});
    while (points.length && points[0].t < t - WINDOW_MS) points.shift();
    const last = points[points.length - 1];
    document.getElementById("rps").textContent = last.rate.toFixed(1);
    document.getElementById("lat").textContent = last.latency.toFixed(2);
  }
  previous = {t, done, count, sum};
  draw("rate", "rate", "#2f6fdb"); draw("latency", "latency", "#d9542b");
  document.body.dataset.updates = ++updates;
}
function connect() {
  const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/status");
  ws.onmessage = event => render(JSON.parse(event.data));
  ws.onclose = () => setTimeout(connect, 1000);
}
connect();
</script></body></html>
"""
