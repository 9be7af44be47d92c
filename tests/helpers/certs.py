"""Certificates for TLS tests, made by the ``openssl`` command line (no
Python dependency, so the conformance harness can use it too):

* ``ca``: a CA that signs the two below;
* ``server_cert``/``server_key``: for ``localhost``, 127.0.0.1 and ::1;
* ``client_cert``/``client_key``: a client certificate (mTLS);
* ``other_ca``: a CA that signed nothing but the next ("the wrong CA");
* ``foreign_cert``/``foreign_key``: a client certificate of ``other_ca``, which
  an mTLS listener taking clients of ``ca`` refuses.

EC P-256 keys, valid for two days: a set is made in well under a second.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_CA_EXT = """basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash"""
_SERVER_EXT = """basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1,IP:::1"""
_CLIENT_EXT = """basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth"""


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    foreign_cert: Path
    foreign_key: Path

    def reissue(self, dest: Path, days: int) -> Path:
        """A new certificate of ``server_key`` (the names of ``server_cert``),
        signed by ``ca``, valid ``days`` days from now (0: it expires as it is
        made), written to ``dest``: a renewal, or an expired certificate."""
        ext = self.dir / "reissue.ext"
        ext.write_text(_SERVER_EXT + "\n")
        csr = self.dir / "reissue.csr"
        run = dict(check=True, capture_output=True, timeout=30)
        subprocess.run(["openssl", "req", "-new", "-key", str(self.server_key), "-subj", "/CN=localhost",
                        "-out", str(csr)], **run)
        subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey",
                        str(self.dir / "ca.key"), "-extfile", str(ext), "-days", str(days), "-out", str(dest)],
                       **run)
        return dest

    def listener(self, address: str, client_ca: bool = False) -> str:
        """A ``[[listen]]`` table serving TLS on ``address`` with the server
        certificate; with ``client_ca``, mTLS (clients of ``ca``)."""
        text = f'\n[[listen]]\naddress = "{address}"\ncert = "{self.server_cert}"\nkey = "{self.server_key}"\n'
        return text + (f'client_ca = "{self.ca}"\n' if client_ca else "")


def available() -> bool:
    return shutil.which("openssl") is not None


def _make(out: Path, name: str, cn: str, ext: str, signer: tuple[Path, Path] | None) -> tuple[Path, Path]:
    """One key and certificate (``signer``: the CA's certificate and key; None: self-signed)."""
    config = out / f"{name}.cnf"
    config.write_text(f"[req]\nprompt = no\ndistinguished_name = dn\nx509_extensions = ext\n"
                      f"[dn]\nCN = {cn}\n[ext]\n{ext}\n")
    cert, key = out / f"{name}.pem", out / f"{name}.key"
    cmd = ["openssl", "req", "-x509", "-new", "-config", str(config), "-newkey", "ec",
           "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
           "-keyout", str(key), "-out", str(cert)]
    if signer:
        cmd += ["-CA", str(signer[0]), "-CAkey", str(signer[1])]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    return cert, key


def make_certs(out: Path) -> Certs:
    """A fresh set in ``out`` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    ca = _make(out, "ca", "agent-sidecar test CA", _CA_EXT, None)
    other_ca = _make(out, "other-ca", "another CA", _CA_EXT, None)
    server_cert, server_key = _make(out, "server", "localhost", _SERVER_EXT, ca)
    client_cert, client_key = _make(out, "client", "test client", _CLIENT_EXT, ca)
    foreign_cert, foreign_key = _make(out, "foreign-client", "a client of another CA", _CLIENT_EXT, other_ca)
    return Certs(out, ca[0], server_cert, server_key, client_cert, client_key, other_ca[0], foreign_cert, foreign_key)
