"""Keys and certificates for a federation where only registered SuperNodes join.

Flower 1.41–1.42 authenticate SuperNodes this way (docs/deploy.md, "Only registered
SuperNodes"): the SuperLink runs with TLS and `--enable-supernode-auth`; each SuperNode owns an
elliptic-curve key pair on a NIST curve (P-384 here, what `ssh-keygen -t ecdsa -b 384` makes),
private key in OpenSSH format, public key as one OpenSSH line; the public key is registered with
the SuperLink through its Control API (`flwr supernode register KEY.pub CONNECTION`) before the
node starts, and the node signs its requests with `--auth-supernode-private-key KEY`. A node whose
key was never registered is refused by the SuperLink. Authentication needs TLS: a SuperNode given
a private key without `--root-certificates` exits (Flower's exit code 303).

`make_node_keys` writes such key pairs and `make_loopback_certificates` a throw-away CA and a
SuperLink certificate for 127.0.0.1, both with the `cryptography` package Flower depends on (no
`ssh-keygen` or `openssl` needed). `fedhet deploy local --auth` uses both.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_node_keys(folder: Path, name: str) -> tuple[Path, Path]:
    """A P-384 key pair for one SuperNode: `folder/NAME` (private, OpenSSH) and
    `folder/NAME.pub` (one OpenSSH line, what `flwr supernode register` reads)."""
    # optional extra: fedhet[flower] (cryptography comes with flwr)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    _write_private(private, key.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


def make_loopback_certificates(folder: Path, days: int = 2) -> tuple[Path, Path, Path]:
    """A CA (`ca.crt`) and a SuperLink certificate for 127.0.0.1 and localhost signed by it
    (`server.pem`, `server.key`), valid for `days` days: TLS for a federation on this machine."""
    # optional extra: fedhet[flower] (cryptography comes with flwr)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(name("fedhet loopback CA"))
          .issuer_name(name("fedhet loopback CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                       x509.DNSName("localhost")])
    cert = (x509.CertificateBuilder().subject_name(name("superlink")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end).add_extension(san, critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths[2], key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.TraditionalOpenSSL,
                                               serialization.NoEncryption()))
    return paths
