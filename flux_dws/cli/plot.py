# SPDX-License-Identifier: LGPL-3.0-only
"""The simulation's timeline as an image: one row per job, one coloured bar per workflow state.

matplotlib is an optional extra (``pip install flux-dws[plot]``); it is imported only here,
and its absence is one line, said before the simulation starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58
from flux_dws.cli.simplan import Ending
from flux_dws.core.states import STATE_ORDER, State

INSTALL_HINT = "pip install flux-dws[plot]"


def check_plotting(path: str | None = None) -> None:
    """DwsError (one line) unless matplotlib can be imported (naming the extra to install)
    and writes the format ``path``'s extension names (naming the formats it writes)."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise DwsError(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None
    if path is None:
        return
    formats = FigureCanvasBase.get_supported_filetypes()
    known = ", ".join(sorted(formats))
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    if not extension:
        raise DwsError(f"--plot {path}: no extension to say the format (one of {known})")
    if extension not in formats:
        raise DwsError(f"--plot {path}: matplotlib cannot write .{extension} (only {known})")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as plt

    return plt


#: The narrowest a state's bar is drawn, as a share of the time axis: a DataIn or DataOut with
#: nothing to copy lasts milliseconds, and would otherwise not be seen to have happened.
MIN_WIDTH = 0.006


@dataclass(frozen=True)
class Bar:
    """One state of one job, as drawn: row, left edge and width in seconds since the start."""

    row: int
    state: State
    left: float
    width: float
    failed: bool  # the job failed (drawn hatched)
    widened: bool  # drawn wider than the state lasted, so that it is seen


def timeline_bars(endings: Sequence[Ending], *, start: float) -> list[Bar]:
    """The bars of the timeline; every state a job went through gets a visible bar."""
    spans = [(row, e, s) for row, e in enumerate(endings) for s in e.spans]
    if not spans:
        return []
    first = min(s.start for _, _, s in spans)
    last = max(s.start + s.duration for _, _, s in spans)
    narrowest = MIN_WIDTH * max(last - first, 1e-9)
    return [
        Bar(
            row=row,
            state=s.state,
            left=s.start - start,
            width=max(s.duration, narrowest),
            failed=e.failed,
            widened=s.duration < narrowest,
        )
        for row, e, s in spans
    ]


def plot_timeline(endings: Sequence[Ending], path: str, *, start: float) -> None:
    """Write a Gantt-like chart of each job's states (and its tasks' run) to ``path``."""
    check_plotting()
    plt = _pyplot()
    fig = draw_timeline(endings, start=start)
    try:
        try:
            fig.savefig(path, dpi=100)
        except OSError as exc:
            raise DwsError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def draw_timeline(endings: Sequence[Ending], *, start: float) -> Any:
    """The timeline as a matplotlib Figure (the caller closes it).

    A failed job's bars are hatched and its label red, with a red cross when the fatal
    exception came; a job that did not end as its story says is marked with a black star.
    Short states are drawn over their neighbours, so that they are seen at all.
    """
    plt = _pyplot()
    colours = dict(zip(STATE_ORDER, plt.get_cmap("tab10").colors))
    height = max(3.0, 0.28 * len(endings) + 1.6)
    fig, ax = plt.subplots(figsize=(11, height))
    try:
        for bar in timeline_bars(endings, start=start):
            ax.barh(
                bar.row,
                bar.width,
                left=bar.left,
                height=0.7,
                color=colours[bar.state],
                edgecolor="white" if bar.failed else "none",
                linewidth=0,
                hatch="////" if bar.failed else None,
                zorder=3 if bar.widened else 2,
            )
        for row, ending in enumerate(endings):
            if ending.ran is not None:
                first, last = ending.ran
                ax.plot([first - start, last - start], [row, row], color="black", lw=2, zorder=4)
            if ending.failed_at is not None:
                ax.plot([ending.failed_at - start], [row], "X", color="red", ms=8, zorder=5)
            if not ending.as_expected:
                end = (ending.ended or ending.failed_at or start) - start
                ax.plot([end], [row], "*", color="black", ms=11, zorder=5)
        ax.set_yticks(range(len(endings)))
        ax.set_yticklabels([_label(e) for e in endings], fontsize=7)
        for tick, ending in zip(ax.get_yticklabels(), endings):
            if ending.failed:
                tick.set_color("red")
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the simulation started")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colours[s]) for s in STATE_ORDER]
        names = [s.value for s in STATE_ORDER]
        handles += [
            plt.Line2D([0], [0], color="black", linewidth=2),
            plt.Rectangle((0, 0), 1, 1, facecolor="grey", edgecolor="white", hatch="////"),
            plt.Line2D([0], [0], marker="X", color="red", linestyle="none", markersize=8),
            plt.Line2D([0], [0], marker="*", color="black", linestyle="none", markersize=11),
        ]
        names += ["tasks running", "job failed", "fatal exception", "not as expected"]
        ax.legend(handles, names, loc="upper right", fontsize=7, ncol=2)
        failed = sum(e.failed for e in endings)
        ax.set_title(
            f"flux dws simulate: {len(endings)} jobs ({failed} failed), workflow states over time"
        )
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return fig


def _label(ending: Ending) -> str:
    outcome = "" if ending.result in ("COMPLETED", None) else f" {ending.result}"
    return f"{ending.job.kind} {f58(ending.jobid)}{outcome}"
