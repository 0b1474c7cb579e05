"""`pearl train --address` drives the run in a child and watches the head itself (runtime/commands/train.py).

The driver notices a lost head by itself only sometimes at once (Ray's GCS client retries for
60 s); the parent stops a child whose head has not answered for HEAD_SILENCE_S. Exercised on
a stand-in child (a sleeping process): what is checked is the watch and the stop, not Ray."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from runtime.commands import train


def _sleeper(seconds: float = 60.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def _closed_port() -> str:
    """An address where nothing listens: a port the OS handed out and that was closed again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@contextmanager
def _listening_head() -> Iterator[tuple[socket.socket, str]]:
    """A socket that answers connections as a live head's GCS port does, and its address."""
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        yield head, f"127.0.0.1:{head.getsockname()[1]}"


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train, "HEAD_SILENCE_S", 1.0)
    monkeypatch.setattr(train, "HEAD_CHECK_S", 0.2)
    monkeypatch.setattr(train, "DRIVER_STOP_GRACE_S", 1.0)


def test_a_silent_head_stops_a_driver_that_does_not_end(quick: None) -> None:
    proc = _sleeper()
    try:
        t0 = time.monotonic()
        assert train._head_lost_before_end(proc, _closed_port())
        assert time.monotonic() - t0 >= train.HEAD_SILENCE_S  # a moment of silence is not a lost head
        assert proc.poll() is None  # the watch only says so; the stop ends it
        train._stop(proc)
        assert proc.returncode == -15  # TERM was enough
    finally:
        proc.kill()


def test_a_head_that_answers_is_watched_until_the_driver_ends(quick: None) -> None:
    with _listening_head() as (_, address):
        proc = _sleeper(3 * train.HEAD_SILENCE_S)
        try:
            assert not train._head_lost_before_end(proc, address)
            assert proc.returncode == 0  # it ended by itself, after more than HEAD_SILENCE_S
        finally:
            proc.kill()


def test_a_driver_that_ignores_term_is_killed(quick: None) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        train._stop(proc)
        assert proc.returncode == -9
    finally:
        proc.kill()


def test_a_head_that_goes_quiet_soon_after_the_driver_is_said_to_be_gone(quick: None) -> None:
    """Ray's processes end after their parent: a head may answer for a moment after its driver ended."""
    with _listening_head() as (head, address):
        assert train._answers_after(address, 0.5)  # it still answers half a second on
        threading.Timer(0.3, head.close).start()
        t0 = time.monotonic()
        assert not train._answers_after(address, 5.0)  # it went quiet within the wait
        assert time.monotonic() - t0 < 5.0
