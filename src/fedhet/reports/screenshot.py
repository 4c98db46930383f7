"""`fedhet report DIR --screenshot PAGE.png`: the report as a reader sees it, via headless Chromium.

The page is rendered at a fixed width (1280 px by default) and a height fitted to its content
(its figures' sizes are read from the PNG headers), so the whole page lands in one image. Chromium
is optional: without it this is one clear line (`FedhetError`), never a traceback. Install it with
`apt-get install chromium` (Debian/Ubuntu) or point `FEDHET_CHROMIUM` at a Chrome binary.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from fedhet.errors import FedhetError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
PAGE_WIDTH = 1280
MAX_HEIGHT = 30000


def find_chromium() -> str | None:
    """The Chromium/Chrome binary to use: `$FEDHET_CHROMIUM`, else the first on PATH."""
    given = os.environ.get("FEDHET_CHROMIUM")
    if given:
        return given if shutil.which(given) or Path(given).is_file() else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def page_height(page: Path, width: int = PAGE_WIDTH) -> int:
    """A height (px) that holds the whole page at `width`: its figures at their drawn size
    (scaled to the content width) plus a line per table row and paragraph."""
    text = page.read_text()
    content = min(width, 1200) - 40
    height = 400
    for src in re.findall(r'<img src="([^"]+)"', text):
        try:
            w, h = png_size(page.parent / src)
        except (OSError, ValueError):
            continue
        height += int(h * min(1.0, content / max(w, 1))) + 60
    height += 26 * text.count("<tr>") + 40 * (text.count("<p") + text.count("<h"))
    return min(height, MAX_HEIGHT)


SCREEN = 1000
"""The height (px) of one screen, for "a page of 16 runs is at most about 4 screens"."""


class _Visible(HTMLParser):
    """What a reader sees before opening any `<details>`: images, table rows, text blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0  # inside this many closed <details>
        self.in_summary = False
        self.images: list[str] = []
        self.rows = 0
        self.blocks = 0

    def handle_starttag(self, tag, attrs):
        if tag == "details":
            self.depth += 0 if "open" in dict(attrs) else 1
            if self.depth == 1 and "open" not in dict(attrs):
                self.blocks += 1  # its summary line shows
        if self.depth:
            return
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))
        elif tag == "tr":
            self.rows += 1
        elif tag in ("p", "h1", "h2", "h3", "figcaption"):
            self.blocks += 1

    def handle_endtag(self, tag):
        if tag == "details" and self.depth:
            self.depth -= 1


def visible_height(page: Path, width: int = PAGE_WIDTH) -> int:
    """`page_height` of the page as it opens, every `<details>` closed: the figures outside
    them at their drawn size (scaled to the content width), a line per table row and text
    block. The proxy the tests hold a page's length to, without a browser."""
    seen = _Visible()
    seen.feed(page.read_text())
    content = min(width, 1200) - 40
    height = 100
    for src in seen.images:
        try:
            w, h = png_size(page.parent / src)
        except (OSError, ValueError):
            continue
        height += int(h * min(1.0, content / max(w, 1))) + 20
    return height + 26 * seen.rows + 40 * seen.blocks


def screenshot(page: Path, png: Path, width: int = PAGE_WIDTH, height: int | None = None,
               timeout: float = 120.0) -> Path:
    """Render `page` (an HTML file) with headless Chromium into `png`; returns `png`."""
    binary = find_chromium()
    if binary is None:
        raise FedhetError("--screenshot needs Chromium or Chrome (apt-get install chromium, or set "
                          "FEDHET_CHROMIUM to its path)")
    height = height or page_height(page, width)
    png = png.resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fedhet-chromium-") as profile:
        cmd = [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={profile}",
            f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri(),
        ]
        # its own process group, so that a hung render is stopped with all its helpers
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
            raise FedhetError(f"chromium took over {timeout:g} s to render {page}") from None
    if proc.returncode != 0 or not png.exists():
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise FedhetError(f"chromium could not render {page}: {last}")
    return png
