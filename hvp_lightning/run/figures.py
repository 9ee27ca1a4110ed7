"""Figure files the commands draw a run's records to (``hvp-monitors --plot``, ``hvp-sweep-summary --plot``)."""

from __future__ import annotations


def plot_formats() -> set[str]:
    """The file types matplotlib can write here (``savefig`` picks one by the name's suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    return set(FigureCanvasBase.get_supported_filetypes())
