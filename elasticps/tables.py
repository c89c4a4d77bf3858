"""Plain text for terminals (the CLI, the manager's events, the demo): tables, and a shape in words."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Columns left-aligned, two spaces apart, as wide as their widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def shape_text(ps: int, workers: int) -> str:
    """A job's shape in words: ``2 PS x 1 worker``, ``1 PS x 4 workers``."""
    return f"{ps} PS x {workers} worker{'' if workers == 1 else 's'}"
