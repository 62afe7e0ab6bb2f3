"""The web tests' fixtures: a served model's app run by uvicorn in a thread (a real server on a socket)."""

import threading
import time

import pytest

from tests.helpers import free_port


class ThreadServer:
    """The app of ``models`` served by uvicorn (the server's configuration) in a thread."""

    def __init__(self, models, **app_kwargs):
        import uvicorn

        from captioning.web.app import create_app
        from captioning.web.guard import Limits
        from captioning.web.server import uvicorn_config

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        limits = app_kwargs.pop("limits", None) or Limits()
        app = create_app(models, limits=limits, **app_kwargs)
        self.server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", self.port, limits, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        end = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < end and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def serve_models(tmp_path):
    """``start(models, **app_kwargs)``: a :class:`ThreadServer` of ServedModel objects, stopped after the test."""
    servers = []

    def start(models, **kwargs):
        servers.append(ThreadServer(models, workdir=str(tmp_path), **kwargs))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def served(serve_models):
    """``start(captioner)``: a server of one captioner, named "fake"."""

    def start(captioner, model_class=None, **kwargs):
        from captioning.web.served import ServedModel

        return serve_models([(model_class or ServedModel)("fake", captioner)], **kwargs)

    return start
