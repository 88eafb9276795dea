"""Tables as Markdown (the .md reports) and as aligned text (the terminal)."""
from __future__ import annotations

import math
import os


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf"
        return f"{value:.4f}"
    return str(value)


def markdown_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(headers, rows) -> str:
    cells = [list(headers)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def write_text(path: str, text: str) -> str:
    """Write ``text`` to ``path`` atomically; returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def skipped_lines(result: dict) -> list:
    """Markdown paragraphs naming the figures of ``result["figures_skipped"]`` ({name: reason}) not drawn."""
    lines = []
    for name, reason in (result.get("figures_skipped") or {}).items():
        lines += [f"`{name}` not drawn: {reason}", ""]
    return lines
