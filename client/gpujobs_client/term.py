"""Text the CLI did not write, made safe to print on a terminal.

Rank output (``gpujobs logs``), job names, reasons, stacks and the server's
error details can hold escape sequences that a terminal obeys: set the window
title (OSC 0/2), write the clipboard (OSC 52), move the cursor or clear the
screen (CSI), or start a device control string. :func:`clean` keeps only
SGR colour (``ESC [ <digits ; :> m``), and only when asked; every other
control character is shown as ``cat -v`` shows it, so nothing reaches the
terminal but text:

- C0 controls (except tab, and newline where the text may span lines) in
  caret notation: ESC as ``^[``, BEL as ``^G``, CR as ``^M``, NUL as ``^@``;
- DEL as ``^?``;
- C1 controls (U+0080 to U+009F) as ``M-`` and the caret form 0x80 below:
  U+009B (CSI) as ``M-^[``, U+009D (OSC) as ``M-^]``.

So an OSC 52 clipboard write ``ESC ] 52 ; c ; aGk= BEL`` prints as
``^[]52;c;aGk=^G``. A line that keeps colour ends with a reset (``ESC [ 0 m``),
so no colour runs on into the next line or the prompt.

:func:`dumps` is ``json.dumps(..., ensure_ascii=False)`` with the C1
controls and DEL written as ``\\u`` escapes too (JSON already escapes C0),
so ``-o json`` output is the same JSON and never a control sequence.
"""
from __future__ import annotations

import json
import os
import re
from typing import IO, Any

_SGR = r"\x1b\[[0-9;:]*m"
_CONTROLS = re.compile(f"({_SGR})|([\\x00-\\x08\\x0a-\\x1f\\x7f-\\x9f])")
_LINE_CONTROLS = re.compile(f"({_SGR})|([\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f])")
_ANY = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_JSON_UNSAFE = re.compile(r"[\x7f-\x9f]")
RESET = "\x1b[0m"


def caret(ch: str) -> str:
    """One control character as ``cat -v`` shows it."""
    o = ord(ch)
    if o == 0x7F:
        return "^?"
    if o >= 0x80:
        return "M-" + caret(chr(o - 0x80))
    return "^" + chr(o + 0x40)


def clean(text: str, *, colour: bool = False, newlines: bool = False) -> str:
    """``text`` with no control sequence left but SGR colour when ``colour``
    (dropped otherwise), every other control character shown in caret
    notation; tab is kept, and newline when ``newlines``."""
    if not _ANY.search(text):
        return text  # the common case: plain text, as it is
    kept = False

    def one(m: re.Match[str]) -> str:
        nonlocal kept
        if m.group(1) is not None:  # SGR colour
            kept = kept or colour
            return m.group(1) if colour else ""
        return caret(m.group(2))

    out = (_CONTROLS if not newlines else _LINE_CONTROLS).sub(one, text)
    return out + RESET if kept else out


def wants_colour(stream: IO[Any], choice: str) -> bool:
    """Whether to keep the colour of text printed on ``stream``: ``always``,
    ``never``, or (``auto``) when it is a terminal and NO_COLOR is unset."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def dumps(value: Any, **kw: Any) -> str:
    """JSON of ``value`` (not ASCII-escaped) with DEL and C1 controls escaped."""
    text = json.dumps(value, ensure_ascii=False, **kw)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
