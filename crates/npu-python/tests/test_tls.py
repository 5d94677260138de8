"""Connecting over TLS with a CA, a client certificate and key (mTLS), and an identity token.

tests/tests/python.rs makes the certificates (rcgen) and names their directory in
NPUD_TEST_PKI: ca.pem, server.crt/.key (localhost, 127.0.0.1), client.crt/.key
(python-client.example).
"""

from __future__ import annotations

import asyncio
import os
import pathlib

import numpy as np
import pytest

import npud

N = 1024


@pytest.fixture(scope="module")
def pki() -> pathlib.Path:
    p = os.environ.get("NPUD_TEST_PKI")
    if not p:
        pytest.fail("NPUD_TEST_PKI is not set: run this suite through tests/tests/python.rs")
    return pathlib.Path(p)


@pytest.fixture(scope="module")
def tls_daemon(npud_bin, pki, tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    tokens = d / "tokens"
    tokens.mkdir()
    (tokens / "py-token").write_text("p" * 40 + "\n")
    cfg = d / "npud.toml"
    cfg.write_text(
        f'[tls]\ncert = "{pki / "server.crt"}"\nkey = "{pki / "server.key"}"\n'
        f'client_ca = "{pki / "ca.pem"}"\nclient_auth = "optional"\n'
        f'[auth]\ntoken_dir = "{tokens}"\n')
    daemon = npud.LocalDaemon(npud_bin, tcp=True, args=["--config", str(cfg)])
    yield daemon, tokens / "py-token"
    daemon.stop()


def https(daemon) -> str:
    return "https://" + daemon.tcp_address.removeprefix("http://")


def test_tls_with_ca_cert_and_key(tls_daemon, pki):
    daemon, _ = tls_daemon
    with npud.Client(https(daemon), ca=pki / "ca.pem", cert=pki / "client.crt",
                     key=pki / "client.key", tls_server_name="localhost") as c:
        info = c.device_info()
        assert info["caller_identity"] == "cert:dns:python-client.example"
        assert info["tcp_security"] == "mtls-optional"
        p = npud.Program.emulated("vector_scalar_add", N, generation=c.generation,
                                  dtype=np.int32, scalar=2)
        a = c.array(np.arange(N, dtype=np.int32))
        b = c.alloc(N, np.int32)
        c.dispatch(p, a, b)
        np.testing.assert_array_equal(b, np.arange(N) + 2)
        s = c.statistics()["sessions"]
        assert [x["identity"] for x in s] == ["cert:dns:python-client.example"]


def test_tls_asyncio_and_a_token(tls_daemon, pki):
    daemon, token = tls_daemon

    async def main():
        c = await npud.Client.connect(https(daemon), ca=str(pki / "ca.pem"),
                                      tls_server_name="localhost", token_file=token)
        try:
            return (await c.device_info_async())["caller_identity"]
        finally:
            c.close()

    assert asyncio.run(main()) == "token:py-token"


def test_tls_with_another_ca_is_refused(tls_daemon, pki):
    daemon, _ = tls_daemon
    with pytest.raises(npud.ConnectError):
        npud.Client(https(daemon), ca=pki / "client.crt", tls_server_name="localhost")
