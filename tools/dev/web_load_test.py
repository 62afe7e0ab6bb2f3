"""Load test of the web server: clients asking for GIFs of the longest captions beside stalled ones
and ones that never read their answers.

    python -m tools.dev.web_load_test --checkpoint CKPT [--clients 64] [--requests 128] [--slow-clients 50]
                                      [--nonreading-clients 50]

Starts ``python -m captioning.web`` on a free port of 127.0.0.1 (only loopback: nothing else is
contacted) with short deadlines, then at once:

* ``--clients`` threads send ``--requests`` good requests in all: a 640 x 480 JPEG with
  ``return_gif=1``, ``return_image=1`` and ``max_new_tokens`` 60 (``--max-new-tokens``): long
  captions whose GIFs fit the server's default GIF budget (61 frames of about 217 x 163 with a
  caption of 60 seven-letter words; at the server's cap of 100 such words the GIF does not fit
  and is left out, as a barely trained model that never ends its caption shows);
* ``--slow-clients`` raw sockets stall, again and again while the good requests run: half send
  half a request header and stop, half send the headers and part of the body and stop; each
  stalled connection is timed until the server closes it;
* ``--nonreading-clients`` raw sockets (a 4 kB receive window) each ask once for the page's
  example image (a 9 MB PNG of random pixels, more than the sockets' buffers hold; the server is
  started with it as ``--examples``) and never read the answer: each such request is counted by
  the server until its connection is reset at the server's ``--send-timeout`` (``send_timeout``
  here); each connection is timed until then, read from the socket's TCP_INFO (Linux) without
  reading the answer.

It stops by itself (every request answered, every connection closed, or ``--time-limit`` seconds),
stops the server, and prints requests/s, p50/p99 latency, the answers' statuses, the stalled and
the non-reading sockets closed, whether ``/healthz`` was ok after, and the server's peak resident
memory (VmHWM from /proc/PID/status).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from captioning.web.client import APIError, caption, encode_multipart
from captioning.web.settings import MAX_TOKENS
from tools.dev.web_bench import start_server, synthetic_jpeg


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


TCP_ESTABLISHED = 1  # tcp_info's first byte: the connection's state (linux/tcp_states.h)


def noise_png(path: Path, width: int = 2000, height: int = 1500) -> Path:
    """A PNG of random pixels (it does not compress: 9 MB at 2000 x 1500) at ``path``."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(1).integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, "PNG")
    return path


def _never_read(port: int, request: bytes, limit: float) -> float:
    """Connect with a small receive window, send ``request`` whole and never read; seconds until the
    server closes or resets the connection (``limit`` if it does not)."""
    start = time.monotonic()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(limit)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        while time.monotonic() - start < limit:
            if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_ESTABLISHED:
                break
            time.sleep(0.1)
    return time.monotonic() - start


def run_load(
    checkpoints: Sequence[str],
    clients: int = 64,
    requests: int = 128,
    slow_clients: int = 50,
    time_limit: float = 45.0,
    header_timeout: float = 2.0,
    body_timeout: float = 3.0,
    max_new_tokens: int = 60,
    nonreading_clients: int = 50,
    send_timeout: float = 3.0,
) -> dict:
    """Run the load against a server started here; the report as a dict (see the module docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="captioning-load-"))
    extra = [
        "--header-timeout",
        str(header_timeout),
        "--body-timeout",
        str(body_timeout),
        "--send-timeout",
        str(send_timeout),
        "--examples",
        str(noise_png(folder / "noise.png")),
        "--max-pending",
        str(max(64, clients)),
        "--max-render",
        str(max(16, clients)),
        "--request-timeout",
        str(time_limit),
        "--threads",
        "1",
    ]
    try:
        proc, url = start_server(list(checkpoints), extra, timeout=120)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    port = int(url.rsplit(":", 1)[1])
    data = synthetic_jpeg()
    _, content_type = encode_multipart({}, "x.jpg", b"")
    ask_example = f"GET /examples/0 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    report: dict = {
        "clients": clients,
        "requests": requests,
        "slow_clients": slow_clients,
        "nonreading_clients": nonreading_clients,
    }
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
                    out = caption(
                        data,
                        url=url,
                        filename=f"photo{i}.jpg",
                        num_beams=3,
                        max_new_tokens=max_new_tokens,
                        return_gif=True,
                        return_image=True,
                        timeout=time_limit,
                    )
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
        with (
            ThreadPoolExecutor(slow_clients or 1) as slow_pool,
            ThreadPoolExecutor(clients) as pool,
            ThreadPoolExecutor(nonreading_clients or 1) as unread_pool,
        ):
            stalled = [
                slow_pool.submit(_stall_until, stop, port, i % 2 == 1, content_type, time_limit)
                for i in range(slow_clients)
            ]
            never = [unread_pool.submit(_never_read, port, ask_example, time_limit) for _ in range(nonreading_clients)]
            start = time.perf_counter()
            list(pool.map(good, range(requests)))
            seconds = time.perf_counter() - start
            stop.set()
            per_client = [f.result() for f in stalled]
            unread = [f.result() for f in never]
        closed = [t for times in per_client for t in times]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
                healthy = sock.recv(65536).startswith(b"HTTP/1.1 200")
        except OSError:
            healthy = False
        report.update(
            {
                "answered": statuses,
                "seconds": round(seconds, 2),
                "requests_per_s": round(requests / seconds, 2),
                "answered_200_per_s": round(sum(n for k, n in statuses.items() if k.startswith("200")) / seconds, 2),
                "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
                "latency_p99_s": round(_percentile(latencies, 0.99), 3) if latencies else None,
                "slow_clients_closed": sum(all(t < time_limit for t in times) for times in per_client),
                "stalled_connections": len(closed),
                "stalled_closed_after_max_s": round(max(closed), 2) if closed else None,
                "nonreading_closed": sum(t < time_limit for t in unread),
                "nonreading_closed_after_max_s": round(max(unread), 2) if unread else None,
                "healthy_after": healthy,
                "alive_after": proc.poll() is None,
                "rss_before_mb": round(rss_before, 1),
                "peak_rss_mb": round(_status_kb(proc.pid, "VmHWM") / 1024, 1),
            }
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a server that does not stop is killed
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", action="append", required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--slow-clients", type=int, default=50)
    p.add_argument(
        "--nonreading-clients",
        type=int,
        default=50,
        help="clients that ask once for a 9 MB example image and never read it",
    )
    p.add_argument("--send-timeout", type=float, default=3.0, help="the server's --send-timeout")
    p.add_argument("--time-limit", type=float, default=45.0)
    p.add_argument(
        "--max-new-tokens", type=int, default=60, help=f"words per caption at most (the server's cap: {MAX_TOKENS})"
    )
    args = p.parse_args(argv)
    report = run_load(
        args.checkpoint,
        args.clients,
        args.requests,
        args.slow_clients,
        args.time_limit,
        max_new_tokens=args.max_new_tokens,
        nonreading_clients=args.nonreading_clients,
        send_timeout=args.send_timeout,
    )
    print(json.dumps(report, indent=2))
    print(
        f"\n{report['requests_per_s']} requests/s ({report['answered_200_per_s']} answered 200), latency p50 {report['latency_p50_s']} s, p99 "
        f"{report['latency_p99_s']} s, peak RSS {report['peak_rss_mb']} MB; answered {report['answered']}; "
        f"{report['slow_clients_closed']}/{report['slow_clients']} stalled sockets closed; "
        f"{report['nonreading_closed']}/{report['nonreading_clients']} non-reading sockets reset; "
        f"healthz ok after: {report['healthy_after']}",
        file=sys.stderr,
    )
    ok = report["healthy_after"] and set(report["answered"]) == {"200"}
    return 0 if ok and report["nonreading_closed"] == report["nonreading_clients"] else 1


if __name__ == "__main__":
    sys.exit(main())
