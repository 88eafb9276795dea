"""Per-layer density tables and the "how much became sparse" summary."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

COLUMNS = ("layer", "kind", "shape", "params", "mflops", "density", "status", "note")


def format_table(rows: Sequence[dict], columns: Sequence[str] = COLUMNS) -> str:
    columns = [c for c in columns if any(c in r for r in rows)]
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def add_flops(rows: Sequence[dict], macs: Dict[str, int]) -> None:
    """Add ``mflops`` (2 x MACs per image / 1e6) to the rows whose layer has a MAC count."""
    for r in rows:
        if r["layer"] in macs:
            r["mflops"] = round(2.0 * macs[r["layer"]] / 1e6, 3)


def summarize(rows: Sequence[dict], total_params: int, macs: Optional[Dict[str, int]], n: int, m: int) -> dict:
    """Shares of the model's parameters and conv/linear FLOPs that are n:m sparse."""
    sparse = [r for r in rows if r["status"] == f"{n}:{m}"]
    sparse_params = sum(r["params"] for r in sparse)
    zeros = sum(round(r["params"] * (1.0 - r["density"])) for r in sparse)
    out = {"pattern": f"{n}:{m}", "sparse_layers": len(sparse), "conv_linear_layers": len(rows),
           "violated_layers": sum(r["status"] == "VIOLATED" for r in rows),
           "params_total": int(total_params), "params_in_sparse_layers": int(sparse_params),
           "params_in_sparse_layers_pct": round(100.0 * sparse_params / max(total_params, 1), 2),
           "params_zero_pct": round(100.0 * zeros / max(total_params, 1), 2)}
    if macs:
        total = sum(macs.values())
        in_sparse = sum(macs.get(r["layer"], 0) for r in sparse)
        out.update(gflops_per_image=round(2.0 * total / 1e9, 4),
                   flops_in_sparse_layers_pct=round(100.0 * in_sparse / max(total, 1), 2),
                   flops_skippable_pct=round(100.0 * in_sparse * (1.0 - n / m) / max(total, 1), 2))
    return out


def summary_lines(s: dict) -> list:
    lines = [f"{s['pattern']}: {s['sparse_layers']} of {s['conv_linear_layers']} conv/linear layers sparse; "
             f"{s['params_in_sparse_layers_pct']:.2f}% of the model's {s['params_total']:,} parameters are in "
             f"sparse layers, {s['params_zero_pct']:.2f}% are zero"]
    if "flops_in_sparse_layers_pct" in s:
        lines.append(f"FLOPs: {s['flops_in_sparse_layers_pct']:.2f}% of the conv/linear FLOPs "
                     f"({s['gflops_per_image']:.3f} GFLOPs/image) run in sparse layers; "
                     f"sparse kernels can skip {s['flops_skippable_pct']:.2f}%")
    return lines
