# SPDX-License-Identifier: LGPL-3.0-only
"""Flux job IDs as users type and read them: decimal, f58 ("ƒ2JqZjdr"), hex ("0x1a2b").

flux-core's own parser (flux.job.JobID) is only there when flux-core's bindings are; the
commands also run against fakeflux, so the few encodings users meet are handled here.
"""

from __future__ import annotations

import os
from typing import TextIO

from flux_dws.base.errors import DwsError

F58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
F58_PREFIXES = ("ƒ", "f")
_F58_VALUE = {ch: i for i, ch in enumerate(F58_ALPHABET)}
_MAX_ID = 2**64 - 1


def parse_jobid(text: str) -> int:
    """The job ID ``text`` names; DwsError (one line, naming ``text``) otherwise."""
    word = text.strip()
    bad = DwsError(f"invalid job ID {text!r} (expected e.g. ƒ2JqZjdr, 123456789 or 0x75bcd15)")
    if word.isdigit() and word.isascii():
        value = int(word)
    elif word[:2].lower() == "0x":
        try:
            value = int(word[2:], 16)
        except ValueError:
            raise bad from None
    elif word.startswith(F58_PREFIXES) and len(word) > 1:
        value = 0
        for ch in word[1:]:
            if ch not in _F58_VALUE:
                raise bad
            value = value * 58 + _F58_VALUE[ch]
    else:
        raise bad
    if value > _MAX_ID:
        raise bad
    return value


def f58(jobid: int, prefix: str = "ƒ") -> str:
    """``jobid`` in Flux's f58 encoding, as ``flux jobs`` shows it."""
    if jobid < 0:
        raise ValueError(f"job ID must not be negative, not {jobid}")
    digits = []
    while True:
        jobid, rest = divmod(jobid, 58)
        digits.append(F58_ALPHABET[rest])
        if jobid == 0:
            break
    return prefix + "".join(reversed(digits))


def f58_prefix(out: TextIO) -> str:
    """The f58 prefix for ``out``: "ƒ" where it can carry it, else "f", and "f" whenever
    FLUX_F58_FORCE_ASCII is set, as flux-core decides."""
    if os.environ.get("FLUX_F58_FORCE_ASCII"):
        return "f"
    encoding = getattr(out, "encoding", None)
    return "ƒ" if encoding is None or "utf" in encoding.lower() else "f"
