"""Read this process's cgroup files: where a controller's files are, limits, counters, stats.

Standard library only. ``root`` is taken to be this process's own cgroup, as a container
with a cgroup namespace sees it at ``/sys/fs/cgroup``: on cgroup v2 (one unified
hierarchy) the files lie in ``root`` itself, on v1 in ``root/<controller>``.
``/proc/self/cgroup`` is not followed, so outside a container the files found are the
hierarchy's root ones (which have no limits).

A path that is not a file reads as missing. Other errors (an unreadable file, text that
is not a number) propagate as ``OSError`` or ``ValueError``; callers treat
them as "unknown".
"""

from pathlib import Path
from typing import NamedTuple

DEFAULT_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 reports "no limit" as a huge number near 2**63 (rounded down to a page).
V1_UNLIMITED = 2**60


class Cgroup(NamedTuple):
    """The directory that holds a controller's files, and the cgroup version (1 or 2)."""

    path: Path
    version: int


def controller_dir(controller: str, root: Path = DEFAULT_ROOT) -> Cgroup | None:
    """Where this process's files for ``controller`` (``"cpu"``, ``"memory"``) are under ``root``.

    cgroup v2 when ``root`` holds the controller's ``<controller>.max`` limit file, then
    ``root``; else cgroup v1 when ``root/<controller>`` is a directory; else ``None``.
    """
    if (root / f"{controller}.max").is_file():
        return Cgroup(root, 2)
    if (root / controller).is_dir():
        return Cgroup(root / controller, 1)
    return None


def read_int(path: Path, field: int = 0) -> int | None:
    """The integer in whitespace-separated ``field`` of a file, ``None`` when it has no such field.

    A missing file has no fields.
    """
    if not path.is_file():
        return None
    fields = path.read_text().split()
    return int(fields[field]) if field < len(fields) else None


def read_limit(path: Path, field: int = 0) -> int | None:
    """A limit in a file (``read_int``), ``None`` when the file or field is missing or
    the value means "unlimited": ``max`` (v2), a negative number or one of at least
    ``V1_UNLIMITED`` (v1)."""
    if not path.is_file():
        return None
    fields = path.read_text().split()
    if field >= len(fields) or fields[field] == "max":
        return None
    value = int(fields[field])
    return None if value < 0 or value >= V1_UNLIMITED else value


def read_stat(path: Path, key: str) -> int | None:
    """The value of ``key`` in a ``<key> <value>`` per line file (``memory.stat``), ``None``
    when the file or the key is missing."""
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None
