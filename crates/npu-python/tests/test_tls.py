"""Connecting over TLS with a CA, a client certificate and key (mTLS), and an identity token.

The certificates: ca.pem, server.crt/.key (localhost, 127.0.0.1), client.crt/.key
(python-client.example). tests/tests/python.rs makes them (rcgen) and names their directory in
NPUD_TEST_PKI; run by hand without it, the suite makes them with the ``openssl`` command.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import npud

N = 1024


def make_pki(d: pathlib.Path) -> None:
    """The certificates tests/tests/python.rs makes, with the openssl command."""
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=npud python test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
        "keyUsage=critical,keyCertSign,cRLSign")
    for name, san, usage in (("server", "DNS:localhost,IP:127.0.0.1", "serverAuth"),
                             ("client", "DNS:python-client.example", "clientAuth")):
        ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        ssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> pathlib.Path:
    p = os.environ.get("NPUD_TEST_PKI")
    if p:
        return pathlib.Path(p)
    if shutil.which("openssl") is None:
        pytest.skip("the TLS tests need certificates: set NPUD_TEST_PKI to a directory holding "
                    "them (tests/tests/python.rs does), or install the openssl command")
    d = tmp_path_factory.mktemp("pki")
    make_pki(d)
    return d


@pytest.fixture(scope="module")
def tls_daemon(npud_bin, pki, tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    tokens = d / "tokens"
    # npud refuses a token directory others can enter (token files are secrets).
    tokens.mkdir(mode=0o700)
    tokens.chmod(0o700)
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

    # One identity per allocation: the file's name and the digest of its secret.
    assert asyncio.run(main()).startswith("token:py-token@")


def test_tls_with_another_ca_is_refused(tls_daemon, pki):
    daemon, _ = tls_daemon
    with pytest.raises(npud.ConnectError):
        npud.Client(https(daemon), ca=pki / "client.crt", tls_server_name="localhost")
