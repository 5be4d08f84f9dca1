"""The benchmark's markdown: one row per preset with cleave's time, the strongest
baseline (named) and the ratio against it (and a decode step's share of the copy
ceiling), then the secondary timings, then why any baseline was not timed."""
from __future__ import annotations

from .paged_baselines import copy_ceiling_fraction
from .strongest import NOT_NEEDED


def _ms(value) -> str:
    return f"{value:.4f}" if value else "—"


def _ratio(baseline_ms, cleave_ms) -> str:
    return f"{baseline_ms / cleave_ms:.2f}" if (baseline_ms and cleave_ms) else "—"


def _ceiling(row: dict) -> str:
    """A decode step's bandwidth as a share of the copy ceiling: cleave / strongest baseline."""
    nbytes = row.get("decode_bytes")
    if not nbytes:
        return "—"
    strongest = row["strongest"] and row["strongest"]["ms"]
    shares = [copy_ceiling_fraction(nbytes, ms) for ms in (row["cleave_ms"], strongest)]
    return " / ".join(f"{s:.0%}" if s is not None else "—" for s in shares)


def _timed(row: dict, name: str):
    return next((b["ms"] for b in row["baselines"] if b["name"] == name), None)


def table(rows: list[dict]) -> str:
    lines = ["| workload | preset | cleave ms | best timed ms | strongest baseline | its ms | ×strongest "
             "| eager ms | ×eager | torch.compile ms | ×torch.compile | err | copy ceiling "
             "| in CUDA graphs: cleave ms | strongest (its ms) | ×strongest |",
             "|" + "---|" * 16]
    for r in rows:
        c = r["cleave_ms"]
        strongest = r["strongest"]
        eager, compiled = _timed(r, "eager"), _timed(r, "torch.compile")
        errs = [p["rel_err"] for p in r["plans"] if "rel_err" in p]
        cells = [r["workload"], r["preset"], _ms(c) if r["plans"] else "no plans", _ms(r.get("best_ms")),
                 strongest["name"] if strongest else "none ran", _ms(strongest and strongest["ms"]),
                 _ratio(strongest and strongest["ms"], c),
                 _ms(eager), _ratio(eager, c), _ms(compiled), _ratio(compiled, c),
                 f"{min(errs):.1e}" if errs else "—", _ceiling(r)] + _graph_cells(r)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _graph_cells(r: dict) -> list[str]:
    """cleave's served plan and the strongest baseline, both replayed from CUDA graphs."""
    c, strongest = r.get("cleave_graph_ms"), r.get("strongest_graph")
    ms = strongest and strongest["graph_ms"]
    share = r.get("decode_bytes") and c and copy_ceiling_fraction(r["decode_bytes"], c)
    cleave = _ms(c) + (f" ({share:.0%} of the copy ceiling)" if share else "")
    return [cleave, f"{strongest['name']} ({_ms(ms)})" if strongest else "none captured", _ratio(ms, c)]


def secondary(rows: list[dict]) -> str:
    """Timings reported beside the table, never the strongest (SDPA on pre-gathered K/V),
    a floor with cleave's time over it."""
    def line(r, b):
        over = f"; cleave's served plan takes {r['cleave_ms'] / b['ms']:.2f}× this" \
            if b.get("floor") and r.get("cleave_ms") else ""
        return f"- {r['workload']} {r['preset']}, {b['name']}: {b['ms']:.4f} ms{over}"

    lines = [line(r, b) for r in rows for b in r["baselines"] if b.get("secondary") and b["ms"]]
    return "\n".join(["Secondary timings (not candidates for the strongest):", ""] + lines) if lines else ""


def skipped(rows: list[dict]) -> str:
    """Every baseline that was tried and not timed, with its reason."""
    lines = []
    for r in rows:
        for b in r["baselines"]:
            if b["skipped"] and b["skipped"] != NOT_NEEDED:
                lines.append(f"- {r['workload']} {r['preset']}, {b['name']}: {b['skipped']}")
    return "\n".join(["Baselines not timed:", ""] + lines) if lines else ""
