"""Fixtures: a real npud on the emulator (the binary named by NPUD_BIN), local and TCP clients.

`cargo nextest run` runs this suite through tests/tests/python.rs (npud-e2e), which builds the
package into a virtual environment and sets NPUD_BIN to the build's own daemon.
"""

from __future__ import annotations

import os
import pathlib

import pytest

import npud

REPO = pathlib.Path(__file__).resolve().parents[3]


def npud_binary() -> str:
    b = os.environ.get("NPUD_BIN")
    if not b:
        for profile in ("debug", "release"):
            c = REPO / "target" / profile / "npud"
            if c.is_file():
                return str(c)
        pytest.fail("set NPUD_BIN to the npud binary (cargo build -p npud)")
    return b


@pytest.fixture(scope="session")
def npud_bin() -> str:
    return npud_binary()


@pytest.fixture(scope="session")
def daemon(npud_bin):
    d = npud.LocalDaemon(npud_bin, tcp=True)
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    c = npud.Client(daemon.address)
    yield c
    try:
        c.close()
    except npud.NpudError:
        pass


@pytest.fixture
def remote(daemon):
    c = npud.Client(daemon.tcp_address)
    yield c
    try:
        c.close()
    except npud.NpudError:
        pass


@pytest.fixture(params=["local", "remote"])
def any_client(request, daemon):
    c = npud.Client(daemon.address if request.param == "local" else daemon.tcp_address)
    yield c
    try:
        c.close()
    except npud.NpudError:
        pass
