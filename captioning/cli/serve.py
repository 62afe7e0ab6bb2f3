"""``captioning serve``: the web page and HTTP API (the ``web`` extra), its flags and its run.

``captioning serve --checkpoint CKPT [--host 127.0.0.1] [--port 7860] [--lang en|zh]``. ``add_serve_arguments(parser)``
adds the flags and ``cmd_serve(args)`` runs the server: the ``Serve`` command and
``python -m captioning.web`` (web/__main__.py) are both these two.
"""

from __future__ import annotations

import argparse

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import THREADS_HELP, at_least, layer_arg
from captioning.errors import ConfigError


@COMMANDS.register("serve")
class Serve(Command):
    help = (
        "a web page and an HTTP API to try models: upload an image, read its captions, see where the model "
        "looked (pip install -e '.[web]')"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_serve_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        return cmd_serve(args)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    value = at_least(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text}")
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``serve``'s flags to ``p``. The web modules whose defaults they show are imported here,
    not at the module's top: ``captioning fit`` imports every command module but builds no flags."""
    from captioning.web.gifs import DEFAULT_GIF_PIXELS
    from captioning.web.page import LANGUAGES
    from captioning.web.server import DEFAULT_HOST, DEFAULT_MAX_PIXELS, DEFAULT_PORT
    from captioning.web.service import DEFAULT_MAX_RENDER

    p.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        metavar="[NAME=]CKPT",
        help="a checkpoint (or a model folder of `captioning export`) to serve; repeat it to compare models side by side "
        "(e.g. --checkpoint soft=a.ckpt --checkpoint hard=b.ckpt); NAME=A+B serves the ensemble of A and B "
        "as one model (their log-probabilities averaged at each step)",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 exposes the "
        "page and the API to every network this machine is on)",
    )
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument(
        "--examples",
        nargs="+",
        default=[],
        metavar="IMAGE|DIR",
        help="example images offered on the page (default: the first test images of the data the "
        "model was trained on, when its run's config.yaml is found)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    p.add_argument(
        "--max-upload-mb", type=at_least(0.001, float), default=10.0, help="largest upload accepted (HTTP 413 above)"
    )
    p.add_argument(
        "--max-pixels",
        type=at_least(1),
        default=DEFAULT_MAX_PIXELS,
        help="largest decoded image (width x height) accepted; larger ones are refused as possible decompression bombs",
    )
    p.add_argument("--max-batch", type=at_least(1), default=8, help="requests captioned together at most")
    p.add_argument("--max-pending", type=at_least(1), default=64, help="requests waiting at most (HTTP 503 beyond)")
    p.add_argument(
        "--max-connections",
        type=at_least(1),
        default=256,
        help="requests being handled at once (HTTP 503 beyond); idle connections are not counted",
    )
    p.add_argument(
        "--max-sockets",
        type=at_least(1),
        default=1024,
        help="open connections at most, idle ones included; one more is closed at once",
    )
    p.add_argument(
        "--header-timeout",
        type=at_least(0.001, float),
        default=10.0,
        metavar="S",
        help="seconds a client has to send a request's headers (the connection is closed beyond)",
    )
    p.add_argument(
        "--body-timeout",
        type=at_least(0.001, float),
        default=60.0,
        metavar="S",
        help="seconds a client has to send a request's body, from its headers (HTTP 408 beyond)",
    )
    p.add_argument(
        "--send-timeout",
        type=at_least(0.001, float),
        default=60.0,
        metavar="S",
        help="seconds a client has to take an answer once it outgrows the server's write buffer (a GIF, "
        "an example image); the connection is reset beyond, its answer dropped",
    )
    p.add_argument(
        "--request-timeout",
        type=at_least(0.001, float),
        default=60.0,
        metavar="S",
        help="seconds a request waits for the model, queue included (HTTP 503 beyond)",
    )
    p.add_argument(
        "--stuck-after",
        type=at_least(0.001, float),
        default=120.0,
        metavar="S",
        help="/healthz answers 503 when the model has been on one batch longer than this",
    )
    p.add_argument(
        "--max-render",
        type=at_least(1),
        default=DEFAULT_MAX_RENDER,
        help="requests waiting for their GIF or display image at most (HTTP 503 beyond)",
    )
    p.add_argument(
        "--max-gif-pixels",
        type=at_least(1),
        default=DEFAULT_GIF_PIXELS,
        help="frames x width x height of one GIF at most; larger ones are shrunk to fit",
    )
    p.add_argument(
        "--allowed-hosts",
        nargs="+",
        default=[],
        metavar="NAME",
        help="Host header names answered besides the --host address and localhost (IP addresses "
        "always are): the names clients use to reach the server, *.example.org for a domain, "
        "* for any (this turns off the DNS-rebinding guard)",
    )
    layer_arg(p, "shown on the page and returned by the API")
    p.add_argument(
        "--lang",
        choices=tuple(LANGUAGES),
        default=None,
        help="the web page's language: en (English) or zh (Simplified Chinese); default: each browser's "
        "(zh when its Accept-Language prefers Chinese, else en). The API's JSON is the same in both",
    )
    p.add_argument("--threads", type=at_least(1), default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return p


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server with the flags of :func:`add_serve_arguments`."""
    from captioning.web.guard import Limits
    from captioning.web.server import serve

    try:
        limits = Limits(
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            request_timeout=args.request_timeout,
            send_timeout=args.send_timeout,
            stuck_after=args.stuck_after,
            max_active=args.max_connections,
            max_sockets=args.max_sockets,
            max_render=args.max_render,
            max_gif_pixels=args.max_gif_pixels,
            allowed_hosts=tuple(args.allowed_hosts),
        )
    except ValueError as err:  # a deadline of nan or inf: "<field> must be ..." names the flag --<field>
        field, _, rest = str(err).partition(" ")
        raise ConfigError(f"--{field.replace('_', '-')} {rest}") from None
    return serve(
        args.checkpoint,
        host=args.host,
        port=args.port,
        device=args.device,
        examples=args.examples,
        max_upload_mb=args.max_upload_mb,
        max_pixels=args.max_pixels,
        max_batch=args.max_batch,
        max_pending=args.max_pending,
        max_connections=args.max_connections,
        threads=args.threads,
        log_level=args.log_level,
        limits=limits,
        layer=args.layer,
        lang=args.lang,
    )
