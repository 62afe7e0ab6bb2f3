"""Load test of the web server: clients asking for GIFs of the longest captions beside stalled ones.

    python -m tools.dev.web_load_test --checkpoint CKPT [--clients 64] [--requests 128] [--slow-clients 50]

Starts ``python -m captioning.web`` on a free port of 127.0.0.1 (only loopback: nothing else is
contacted) with short deadlines, then at once:

* ``--clients`` threads send ``--requests`` good requests in all: a 640 x 480 JPEG with
  ``return_gif=1``, ``return_image=1`` and ``max_new_tokens`` 60 (``--max-new-tokens``): long
  captions whose GIFs fit the server's default GIF budget (61 frames of about 217 x 163 with a
  caption of 60 seven-letter words; at the server's cap of 100 such words the GIF does not fit
  and is left out, as a barely trained model that never ends its caption shows);
* ``--slow-clients`` raw sockets stall, again and again while the good requests run: half send
  half a request header and stop, half send the headers and part of the body and stop; each
  stalled connection is timed until the server closes it.

It stops by itself (every request answered, or ``--time-limit`` seconds), stops the server, and
prints requests/s, p50/p99 latency, the answers' statuses, the stalled sockets closed, whether
``/healthz`` was ok after, and the server's peak resident memory (VmHWM from /proc/PID/status).
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from tools.dev.web_bench import start_server, synthetic_jpeg
from captioning.web.client import APIError, caption, encode_multipart
from captioning.web.settings import MAX_TOKENS


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _stall_until(stop: threading.Event, port: int, body: bool, content_type: str, limit: float) -> list[float]:
    """Stall again and again until ``stop``: the seconds each stalled connection lasted."""
    times = [_stall(port, body, content_type, limit)]
    while not stop.is_set():
        times.append(_stall(port, body, content_type, limit))
    return times


def _stall(port: int, body: bool, content_type: str, limit: float) -> float:
    """Connect, send part of a request and stop; seconds until the server closes (``limit`` if never)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as sock:
        head = f"POST /api/caption HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        if body:
            sock.sendall(f"{head}Content-Type: {content_type}\r\nContent-Length: 200000\r\n\r\n".encode() + b"-" * 500)
        else:
            sock.sendall(head.encode() + b"Content-Le")
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
    return time.monotonic() - start


def run_load(checkpoints: Sequence[str], clients: int = 64, requests: int = 128, slow_clients: int = 50,
             time_limit: float = 45.0, header_timeout: float = 2.0, body_timeout: float = 3.0,
             max_new_tokens: int = 60) -> dict:
    """Run the load against a server started here; the report as a dict (see the module docstring)."""
    extra = ["--header-timeout", str(header_timeout), "--body-timeout", str(body_timeout),
             "--max-pending", str(max(64, clients)), "--max-render", str(max(16, clients)),
             "--request-timeout", str(time_limit), "--threads", "1"]
    proc, url = start_server(list(checkpoints), extra, timeout=120)
    port = int(url.rsplit(":", 1)[1])
    data = synthetic_jpeg()
    _, content_type = encode_multipart({}, "x.jpg", b"")
    report: dict = {"clients": clients, "requests": requests, "slow_clients": slow_clients}
    try:
        rss_before = _status_kb(proc.pid, "VmRSS") / 1024
        deadline = time.monotonic() + time_limit
        latencies: list[float] = []
        statuses: dict[str, int] = {}
        lock = threading.Lock()

        def good(i: int) -> None:
            if time.monotonic() > deadline:
                status = "not sent (time limit)"
            else:
                start = time.perf_counter()
                try:
                    out = caption(data, url=url, filename=f"photo{i}.jpg", num_beams=3, max_new_tokens=max_new_tokens,
                                  return_gif=True, return_image=True, timeout=time_limit)
                    status = "200" if out.get("gif") else "200 without a GIF"
                except APIError as err:
                    status = str(err.status)
                except OSError as err:
                    status = type(err).__name__
                with lock:
                    latencies.append(time.perf_counter() - start)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

        stop = threading.Event()
        with ThreadPoolExecutor(slow_clients or 1) as slow_pool, ThreadPoolExecutor(clients) as pool:
            stalled = [slow_pool.submit(_stall_until, stop, port, i % 2 == 1, content_type, time_limit)
                       for i in range(slow_clients)]
            start = time.perf_counter()
            list(pool.map(good, range(requests)))
            seconds = time.perf_counter() - start
            stop.set()
            per_client = [f.result() for f in stalled]
        closed = [t for times in per_client for t in times]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
                healthy = sock.recv(65536).startswith(b"HTTP/1.1 200")
        except OSError:
            healthy = False
        report.update({
            "answered": statuses, "seconds": round(seconds, 2), "requests_per_s": round(requests / seconds, 2),
            "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "latency_p99_s": round(_percentile(latencies, 0.99), 3) if latencies else None,
            "slow_clients_closed": sum(all(t < time_limit for t in times) for times in per_client),
            "stalled_connections": len(closed), "stalled_closed_after_max_s": round(max(closed), 2) if closed else None,
            "healthy_after": healthy, "alive_after": proc.poll() is None,
            "rss_before_mb": round(rss_before, 1), "peak_rss_mb": round(_status_kb(proc.pid, "VmHWM") / 1024, 1),
        })
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a server that does not stop is killed
            proc.kill()
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", action="append", required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--slow-clients", type=int, default=50)
    p.add_argument("--time-limit", type=float, default=45.0)
    p.add_argument("--max-new-tokens", type=int, default=60, help=f"words per caption at most (the server's cap: {MAX_TOKENS})")
    args = p.parse_args(argv)
    report = run_load(args.checkpoint, args.clients, args.requests, args.slow_clients, args.time_limit,
                      max_new_tokens=args.max_new_tokens)
    print(json.dumps(report, indent=2))
    print(f"\n{report['requests_per_s']} requests/s, latency p50 {report['latency_p50_s']} s, p99 "
          f"{report['latency_p99_s']} s, peak RSS {report['peak_rss_mb']} MB; answered {report['answered']}; "
          f"{report['slow_clients_closed']}/{report['slow_clients']} stalled sockets closed; "
          f"healthz ok after: {report['healthy_after']}", file=sys.stderr)
    return 0 if report["healthy_after"] and set(report["answered"]) == {"200"} else 1


if __name__ == "__main__":
    sys.exit(main())
