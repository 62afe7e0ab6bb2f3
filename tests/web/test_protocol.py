"""The uvicorn private protocol web/protocol.py extends: the installed release has every method the
guard overrides, and a release without one is refused in one line naming the releases tested."""

import pytest

pytest.importorskip("uvicorn", reason="the web extra: pip install -e '.[web]'")

from uvicorn.protocols.http.h11_impl import H11Protocol  # noqa: E402

from captioning.errors import ConfigError  # noqa: E402
from captioning.web.protocol import EXTENDED, TESTED_UVICORN, check_protocol, guarded_protocol  # noqa: E402


def test_the_installed_uvicorn_has_what_the_guard_extends():
    check_protocol()
    guarded = guarded_protocol(header_timeout=5, max_sockets=4)
    assert issubclass(guarded, H11Protocol)
    assert all(getattr(guarded, name) is not getattr(H11Protocol, name) for name in EXTENDED)


def test_a_release_that_changed_the_private_protocol_is_one_line():
    changed = type("H11Protocol", (), {name: lambda self: None for name in EXTENDED if name != "handle_events"})
    with pytest.raises(ConfigError) as info:
        check_protocol(changed)
    message = str(info.value)
    assert "\n" not in message and "has no handle_events()" in message
    assert f"pip install 'uvicorn>={TESTED_UVICORN[0]},<={TESTED_UVICORN[1]}'" in message
