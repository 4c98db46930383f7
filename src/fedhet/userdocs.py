"""The user docs that ship inside the package (`fedhet docs [TOPIC]`).

`fedhet/docs/` holds the markdown pages of the repository's `docs/` (in a checkout it is a link
to that folder, the one copy of them; a wheel carries the files themselves as package data), so
an installed fedhet has every page its help texts and report pages name. A topic is a page's
file name without `.md` (`grids`, `gpu`, `deploy`, `fedveca`, ...).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.registry import did_you_mean

REFERENCE = re.compile(r"(?:docs/([a-z0-9][a-z0-9-]*)\.md|fedhet docs ([a-z0-9][a-z0-9-]*))")
"""How code and pages name a doc: `docs/grids.md` or `fedhet docs grids` (topics are lower case,
so `fedhet docs TOPIC` is no reference)."""


def docs_dir() -> Path:
    """The folder of the shipped pages."""
    return Path(str(resources.files("fedhet") / "docs"))


def topics() -> dict[str, Path]:
    """Topic → its page, in name order."""
    folder = docs_dir()
    return {p.stem: p for p in sorted(folder.glob("*.md"))} if folder.is_dir() else {}


def title(path: Path) -> str:
    """A page's first heading (its title)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def doc_path(topic: str) -> Path:
    """The page of `topic` (`grids`, `grids.md` and `docs/grids.md` all name it)."""
    name = Path(topic.strip()).name.removesuffix(".md")
    pages = topics()
    if name in pages:
        return pages[name]
    if not pages:
        raise FedhetError(f"no docs found in {docs_dir()} (a broken install? reinstall fedhet)")
    raise FedhetError(f"no doc named {topic!r}{did_you_mean(name, list(pages))}; topics: "
                      f"{', '.join(pages)} (`fedhet docs` lists them)")


def listing() -> str:
    """`fedhet docs` without a topic: each topic with its title, and where the pages are."""
    pages = topics()
    width = max((len(t) for t in pages), default=0)
    lines = [f"  {t:<{width}}  {title(p)}" for t, p in pages.items()]
    return "\n".join([f"fedhet docs TOPIC prints one; the pages are in {docs_dir()}:", *lines])


def referenced(text: str) -> set[str]:
    """The doc topics `text` names (`docs/X.md`, `fedhet docs X`)."""
    return {a or b for a, b in REFERENCE.findall(text)}
