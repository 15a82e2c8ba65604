# SPDX-License-Identifier: LGPL-3.0-only
"""``flux dws simulate``'s progress: one line per job as it ends, and a progress line.

The progress line (jobs ended of total, failures so far, elapsed time) is drawn in place by
tqdm when stderr is a terminal, and printed as a plain line every ``PLAIN_EVERY`` seconds
otherwise, so a log file or CI job sees it too.  Both start before the first job is
submitted: a person sees something move at once, not when the first job ends.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional, TextIO

from flux_dws.base.jobid import f58
from flux_dws.cli.simplan import Ending, PlannedJob, scaled_note
from flux_dws.cli.views import format_duration

#: Seconds between two plain progress lines (stderr not a terminal).
PLAIN_EVERY = 10.0

#: (jobid, job, stage, since) of a job that has not ended, as the run loop sees it.
Active = tuple[int, PlannedJob, str, Optional[float]]


def status_text(done: int, total: int, failed: int, unexpected: int) -> str:
    """ "12/40 jobs ended, 3 failed, 0 not as expected" (failed: FAILED or CANCELED)."""
    return f"{done}/{total} jobs ended, {failed} failed, {unexpected} not as expected"


def ending_line(ending: Ending, now: float, prefix: str, time_scale: float) -> str:
    """One ended job: its ID, kind, result, verdict, how long it took and the reason."""
    took = (ending.ended or now) - ending.submitted
    verdict = "as expected" if ending.as_expected else "NOT as expected"
    note = scaled_note(ending.note, time_scale)
    note = f" ({note})" if note else ""
    return (
        f"{f58(ending.jobid, prefix):>12} {ending.job.kind:<13}"
        f" {ending.result or 'not ended':<9} {verdict:<15} {format_duration(took):>7}{note}"
    )


class Progress:
    """Job endings to ``lines``; the progress line to ``err`` (tqdm if ``err`` is a TTY)."""

    def __init__(
        self,
        lines: TextIO,
        err: TextIO,
        *,
        total: int,
        start: float,
        prefix: str,
        time_scale: float,
    ) -> None:
        self.lines, self.err = lines, err
        self.total, self.start, self.prefix = total, start, prefix
        self.time_scale = time_scale
        self.done = self.failed = self.unexpected = 0
        self.last_plain: float | None = None
        self.bar: Any = None
        if _isatty(err):
            from tqdm import tqdm

            size = _size(err)  # a pty may not know its size: 0 would draw nothing
            self.bar = tqdm(
                total=total,
                file=err,
                unit="job",
                dynamic_ncols=size is not None,
                ncols=None if size else 100,
                nrows=None if size else 30,
                bar_format="{n_fmt}/{total_fmt} jobs ended |{bar}| {elapsed} elapsed{postfix}",
                leave=True,
            )
        self.tick([], start)

    def _write(self, text: str, stream: TextIO) -> None:
        if self.bar is not None:
            self.bar.write(text, file=stream)  # clears the bar, writes, redraws it
        else:
            print(text, file=stream, flush=True)

    def say(self, text: str) -> None:
        """A sentence about the run as a whole (e.g. the --timeout expired)."""
        self._write(f"flux dws simulate: {text}", self.err)

    def ended(self, ending: Ending, now: float) -> None:
        self.done += 1
        self.failed += ending.failed
        self.unexpected += not ending.as_expected
        self._write(ending_line(ending, now, self.prefix, self.time_scale), self.lines)
        if self.bar is not None:
            self.bar.update(1)

    def tick(self, active: Sequence[Active], now: float) -> None:
        """Redraw the progress line (TTY), or print it if PLAIN_EVERY passed since the last."""
        failures = f"{self.failed} failed, {self.unexpected} not as expected"
        if self.bar is not None:
            self.bar.set_postfix_str(f"{failures}, {len(active)} active", refresh=False)
            self.bar.refresh()
        elif self.last_plain is None or now - self.last_plain >= PLAIN_EVERY:
            self._plain(now)

    def _plain(self, now: float) -> None:
        self.last_plain = now
        text = status_text(self.done, self.total, self.failed, self.unexpected)
        elapsed = format_duration(now - self.start)
        self._write(f"flux dws simulate: {text}, {elapsed} elapsed", self.err)

    def close(self, now: float) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.last_plain != now:
            self._plain(now)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _size(stream: TextIO) -> os.terminal_size | None:
    """The size of the terminal ``stream`` is on; None if it cannot be told (or is 0x0)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return None
    return size if size.columns > 0 and size.lines > 0 else None
