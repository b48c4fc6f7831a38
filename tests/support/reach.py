"""Files of the checkout a test hands to a job's ranks, where they can read
them: as root, ranks run as uids of their own, and a checkout under a folder
others cannot search (a 0700 /root, ``mktemp -d``) is out of their reach.
Then the examples are read from the copy devstack/reach.py keeps beside the
virtualenvs (the same one ``make up``'s agents run beside), brought up to
date when this is first asked; anywhere else, from the checkout itself."""
from __future__ import annotations

import functools
import pathlib

from devstack import reach


@functools.cache
def _examples() -> pathlib.Path:
    return reach.examples()


def example(name: str) -> str:
    """The path of ``examples/<name>`` a rank can read."""
    return str(_examples() / name)
