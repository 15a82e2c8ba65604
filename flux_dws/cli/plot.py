"""The simulation's timeline as a PNG: one row per job, one coloured bar per workflow state.

matplotlib is an optional extra (``pip install flux-dws[plot]``); it is imported only here,
and its absence is one line, said before the simulation starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flux_dws.cli.jobid import f58
from flux_dws.cli.simplan import Ending
from flux_dws.errors import DwsError
from flux_dws.states import STATE_ORDER

INSTALL_HINT = "pip install flux-dws[plot]"


def check_plotting() -> None:
    """DwsError (one line, naming the extra to install) unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DwsError(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(endings: Sequence[Ending], path: str, *, start: float) -> None:
    """Write a Gantt-like chart of each job's states (and its tasks' run) to ``path``."""
    check_plotting()
    plt = _pyplot()
    colours = dict(zip(STATE_ORDER, plt.get_cmap("tab10").colors))
    height = max(3.0, 0.28 * len(endings) + 1.6)
    fig, ax = plt.subplots(figsize=(11, height))
    try:
        for row, ending in enumerate(endings):
            for span in ending.spans:
                ax.barh(
                    row,
                    span.duration,
                    left=span.start - start,
                    height=0.7,
                    color=colours[span.state],
                    edgecolor="none",
                )
            if ending.ran is not None:
                first, last = ending.ran
                ax.plot([first - start, last - start], [row, row], color="black", linewidth=2)
            if not ending.as_expected:
                end = (ending.ended or start) - start
                ax.plot([end], [row], marker="x", color="red", markersize=8)
        labels = [f"{e.job.kind} {f58(e.jobid)}" for e in endings]
        ax.set_yticks(range(len(endings)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the simulation started")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colours[s]) for s in STATE_ORDER]
        handles.append(plt.Line2D([0], [0], color="black", linewidth=2))
        names = [s.value for s in STATE_ORDER] + ["tasks running"]
        ax.legend(handles, names, loc="upper right", fontsize=7, ncol=2)
        ax.set_title(f"flux dws simulate: {len(endings)} jobs, workflow states over time")
        fig.tight_layout()
        try:
            fig.savefig(path, dpi=100)
        except OSError as exc:
            raise DwsError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
