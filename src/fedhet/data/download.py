"""A small download helper: urllib, a timeout, an MD5 check where known, an atomic write.

`fetch` raises `DownloadError` (not `FedhetError`): the loaders catch it and turn it into one
error that names the files expected and where to put them, since offline machines (and these
build machines) cannot reach the canonical sites.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

TIMEOUT_S = 30.0
CHUNK = 1 << 20


class DownloadError(Exception):
    """A download that did not produce a verified file."""


def md5sum(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(url: str, dest: Path, md5: str | None = None, timeout: float = TIMEOUT_S) -> Path:
    """Download `url` to `dest`; the file appears only once complete and (with `md5`) verified."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            shutil.copyfileobj(response, out, CHUNK)
        if md5 is not None and (got := md5sum(tmp)) != md5:
            raise DownloadError(f"{url}: checksum mismatch (MD5 {got}, expected {md5})")
        os.replace(tmp, dest)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise DownloadError(f"{url}: {getattr(e, 'reason', e)}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch_any(urls: Sequence[str], dest: Path, md5: str | None = None) -> Path:
    """Try each mirror in turn; `DownloadError` listing every failure if none works."""
    failures = []
    for url in urls:
        try:
            return fetch(url, dest, md5)
        except DownloadError as e:
            failures.append(str(e))
    raise DownloadError("; ".join(failures) or "no source URL")


def extract_tar(archive: Path, into: Path) -> None:
    """Unpack a `.tar.gz` with the 'data' filter (no absolute paths, links out, devices)."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DownloadError(f"{archive}: cannot unpack ({e})") from e
