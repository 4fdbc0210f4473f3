"""The one Markdown-table helper: ``table_lines`` for headers and rows of strings (what the report
and ``results.md`` print), ``markdown_table`` for a DataFrame (``deltarl grid``'s results)."""

from __future__ import annotations


def cell(v) -> str:
    """A DataFrame value as a table cell: floats to 3 decimals below 10, else 1; NaN empty."""
    if isinstance(v, float):
        return "" if v != v else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def frame_cells(df) -> tuple[list[str], list[list[str]]]:
    """A DataFrame's column names and its rows as table cells (:func:`cell`)."""
    return [str(c) for c in df.columns], [[cell(v) for v in r] for r in df.itertuples(index=False)]


def table_lines(headers: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    """A Markdown table, one line per row. ``align``: one character per column, ``r`` for
    right-aligned (``---:``), anything else left; None: no alignment markers. A ``|`` inside a
    cell is escaped."""
    marks = ["---:" if a == "r" else "---" for a in align] if align else ["---"] * len(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "".join(m + "|" for m in marks)]
    return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]


def markdown_table(df) -> str:
    """A DataFrame as a Markdown table (``results.md`` of a grid, the CLI's printout)."""
    headers, rows = frame_cells(df)
    return "\n".join(table_lines(headers, rows)) + "\n"
