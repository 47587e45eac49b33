"""What the PNG (matplotlib) and HTML (bokeh) renderers of ``logbook plot`` draw
alike: the sub-runs' and incident kinds' colours, the faded steps, the legend.
Its own module so that the renderers and the plot facade that picks them import
it, not each other."""

from __future__ import annotations

from typing import Sequence

SUBRUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""One colour per sub-run, cycling (matplotlib's tab10, d3's category10): neighbours always differ."""
KIND_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
                "#e41a1c", "#377eb8", "#984ea3", "#000000")
"""One colour per incident kind (ColorBrewer's Dark2, then four of Set1 and black: a run can meet all
twelve kinds), darker than the sub-runs' colours."""
FADED_ALPHA = 0.25
"""Opacity of the steps a rollback threw away (kept steps are opaque)."""
LEGEND_SUBRUNS = 12
"""Sub-runs named one by one in a legend; a longer lineage is named by colour."""


def subrun_colours(subruns: Sequence[str]) -> dict[str, str]:
    """Each sub-run's colour by its position in the lineage."""
    return {subrun: SUBRUN_COLOURS[i % len(SUBRUN_COLOURS)] for i, subrun in enumerate(subruns)}


def kind_colours(incidents: Sequence[dict]) -> dict[str, str]:
    """Each incident kind's colour, kinds in alphabetical order."""
    kinds = sorted({mark["kind"] for mark in incidents})
    return {kind: KIND_COLOURS[i % len(KIND_COLOURS)] for i, kind in enumerate(kinds)}


def legend_entries(subruns: Sequence[str]) -> list[tuple[str, str]]:
    """(label, sub-run whose line it shows) for a legend: each sub-run up to
    :data:`LEGEND_SUBRUNS`; beyond, one entry per colour naming the sub-runs that share it."""
    if len(subruns) <= LEGEND_SUBRUNS:
        return [(f"sub-run {subrun}", subrun) for subrun in subruns]
    entries = []
    for first in range(min(len(SUBRUN_COLOURS), len(subruns))):
        sharing = subruns[first::len(SUBRUN_COLOURS)]
        middle = f", {sharing[1]}" + (", …" if len(sharing) > 3 else "") if len(sharing) > 2 else ""
        entries.append((f"{sharing[0]}{middle}, {sharing[-1]}" if len(sharing) > 1 else sharing[0], sharing[0]))
    return entries
