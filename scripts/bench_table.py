"""The benchmark suite's results.json (`scripts/bench_moe.py --suite`) as a markdown table,
under a line naming the card, commit, date and command; with --write FILE, the table replaces
what lies between the markers `<!-- bench-table:begin -->` and `<!-- bench-table:end -->` in
FILE (the markers stay), so a README's table is generated, never typed.

    python scripts/bench_table.py benchmarks/results/h100-2026-12-07/results.json
    python scripts/bench_table.py benchmarks/results/h100-2026-12-07/results.json \\
        --write README.md --recipes bf16 --paths alltoall separate megakernels
    python scripts/bench_table.py benchmarks/results/h100-2026-12-07/results.json --summary

--summary gives one row per shape instead: alltoall's fwd+bwd time, and each other baseline's
and each recipe's default path (the recipe as shipped) as its speedup over alltoall, then the
fastest mok configuration.

Times are milliseconds (median over iterations of the max over ranks); TFLOP/s, roofline and
the speedups are fwd+bwd's. A row that did not run names why in a footnote. Standard library
only, so it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Optional

BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio(ratios: Optional[dict]) -> str:
    value = (ratios or {}).get("fwd_bwd")
    return "-" if value is None else f"{value:.2f}x"


def _roofline(row: dict) -> str:
    pct = row.get("roofline_pct_fwd_bwd")
    return "-" if pct is None else f"{pct:.0f}% {row['roofline']['fwd_bwd']['binding']}"


def _check(row: dict) -> str:
    check = row.get("check")
    if check is None:
        return "reference" if row.get("status") == "ok" else "-"
    worst = check["worst"]
    if check["passed"]:
        return f"ok {worst:.1e}"
    return f"FAIL {worst:.1e} > {check['tolerance']:g}"


# (header, cell of a row that ran)
COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("layer", lambda r: f"{r['model']} {r['variant']}"),
    ("E", lambda r: str(r["experts"])),
    ("T", lambda r: str(r["tokens"])),
    ("recipe", lambda r: r["recipe"]),
    ("path", lambda r: r["path"]),
    ("fwd ms", lambda r: _ms(r.get("fwd_ms"))),
    ("bwd ms", lambda r: _ms(r.get("bwd_ms"))),
    ("fwd+bwd ms", lambda r: _ms(r.get("fwd_bwd_ms"))),
    ("peak GiB", lambda r: _ms(r.get("peak_fwd_bwd_gib"))),
    ("TFLOP/s", lambda r: "-" if r.get("tflops_fwd_bwd") is None
     else f"{r['tflops_fwd_bwd']:.0f}"),
    ("roofline", _roofline),
    ("vs alltoall", lambda r: _ratio(r.get("speedup_vs_alltoall"))),
    ("vs default", lambda r: _ratio(r.get("speedup_vs_default"))),
    ("check", _check),
]
# Columns a row that did not run still fills; the others are blank but for its footnote.
IDENTITY = 5


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def selected(rows: list[dict], recipes: Optional[list[str]] = None,
             paths: Optional[list[str]] = None) -> list[dict]:
    return [r for r in rows if (not recipes or r["recipe"] in recipes)
            and (not paths or r["path"] in paths)]


def render_table(doc: dict, recipes: Optional[list[str]] = None,
                 paths: Optional[list[str]] = None) -> str:
    """The rows (those of `recipes` and `paths` where given) as a markdown table, then one
    footnote per distinct reason a row did not run."""
    notes: dict[str, int] = {}
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|" + "|".join("---" if i < IDENTITY else "--:" for i in range(len(COLUMNS))) + "|"]
    for row in selected(doc["rows"], recipes, paths):
        if row["status"] == "ok":
            cells = [cell(row) for _, cell in COLUMNS]
        else:
            note = notes.setdefault(row["status"], len(notes) + 1)
            word = row["status"].split(":", 1)[0]
            cells = ([cell(row) for _, cell in COLUMNS[:IDENTITY]]
                     + [f"{word} [{note}]"] + [""] * (len(COLUMNS) - IDENTITY - 1))
        lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    lines += [""] + [f"- [{n}] {_escape(status)}" for status, n in notes.items()]
    return "\n".join(lines).rstrip() + "\n"


def _speedup(row: Optional[dict]) -> str:
    if row is None:
        return "-"
    if row["status"] != "ok":
        return row["status"].split(":", 1)[0]
    return _ratio(row.get("speedup_vs_alltoall"))


def by_shape(rows: list[dict]) -> dict[tuple, dict[tuple[str, str], dict]]:
    """The rows per shape (model, variant, experts, tokens), each by (recipe, path)."""
    shapes: dict[tuple, dict[tuple[str, str], dict]] = {}
    for row in rows:
        key = (row["model"], row["variant"], row["experts"], row["tokens"])
        shapes.setdefault(key, {})[(row["recipe"], row["path"])] = row
    return shapes


def render_summary(doc: dict) -> str:
    """One row per shape: alltoall's fwd+bwd ms; each other baseline and each recipe's default
    path as fwd+bwd speedup over alltoall (or why it did not run); the fastest mok row."""
    meta = doc["meta"]
    # The baselines the suite ran (rows of paths that are not mok's), alltoall first.
    baselines = [p for p in dict.fromkeys(r["path"] for r in doc["rows"])
                 if p not in meta["paths"] and p != "alltoall"]
    defaults = meta["default_paths"]
    header = (["layer", "E", "T", "alltoall fwd+bwd ms"] + baselines
              + [f"{recipe} ({path})" for recipe, path in defaults.items()] + ["fastest mok"])
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i < 1 else "--:" for i in range(len(header))) + "|"]
    for (model, variant, experts, tokens), rows in by_shape(doc["rows"]).items():
        by_path = {path: row for (_, path), row in rows.items()}
        alltoall = by_path.get("alltoall")
        mok = [r for (_, path), r in rows.items() if r["status"] == "ok"
               and path in meta["paths"] and r.get("speedup_vs_alltoall")]
        best = max(mok, key=lambda r: r["speedup_vs_alltoall"]["fwd_bwd"], default=None)
        cells = [f"{model} {variant}", str(experts), str(tokens),
                 _ms(alltoall.get("fwd_bwd_ms")) if alltoall else "-"]
        cells += [_speedup(by_path.get(b)) for b in baselines]
        cells += [_speedup(rows.get((recipe, path))) for recipe, path in defaults.items()]
        cells.append("-" if best is None
                     else f"{_ratio(best['speedup_vs_alltoall'])} ({best['recipe']} {best['path']})")
        lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def source_line(doc: dict, results_path: Optional[str] = None) -> str:
    """One line: where the table's figures come from."""
    meta = doc["meta"]
    commit = meta["commit"] + (" with uncommitted changes" if meta.get("dirty") else "")
    shapes_done = len(by_shape(doc["rows"]))
    partial = ("" if meta.get("complete")
               else f" Partial run: {shapes_done} of {len(meta['shapes'])} shapes.")
    where = f" Source: `{results_path}`." if results_path else ""
    return (f"Measured on {meta['gpus']}x {meta['card']} (EP={meta['gpus']}), commit {commit}, "
            f"{meta['date'][:10]} UTC, torch {meta['torch']}, {meta['iters']} timed calls "
            f"after {meta['warmup']}: `{meta['command']}`.{partial}{where}")


def render(doc: dict, results_path: Optional[str] = None,
           recipes: Optional[list[str]] = None, paths: Optional[list[str]] = None,
           summary: bool = False) -> str:
    body = render_summary(doc) if summary else render_table(doc, recipes, paths)
    return source_line(doc, results_path) + "\n\n" + body


def replace_between_markers(text: str, block: str) -> str:
    """`text` with what lies between BEGIN and END replaced by `block`; the markers stay, each
    on its own line. Raises ValueError unless each marker appears once, BEGIN first."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"expected one {BEGIN} and one {END}, found {text.count(BEGIN)} and "
                         f"{text.count(END)}")
    begin, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if end < begin:
        raise ValueError(f"{END} comes before {BEGIN}")
    return text[:begin] + "\n" + block.rstrip("\n") + "\n" + text[end:]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a suite's results.json")
    p.add_argument("--write", type=Path, default=None,
                   help="markdown file whose bench-table markers get the table (else: stdout)")
    p.add_argument("--recipes", nargs="+", default=None, help="only these recipes' rows")
    p.add_argument("--paths", nargs="+", default=None, help="only these paths' rows")
    p.add_argument("--summary", action="store_true",
                   help="one row per shape: the baselines and each recipe's default path")
    args = p.parse_args(argv)
    if args.summary and (args.recipes or args.paths):
        p.error("--summary shows every recipe's default path: no --recipes / --paths")
    doc = json.loads(args.results.read_text())
    block = render(doc, str(args.results), args.recipes, args.paths, args.summary)
    if args.write is None:
        print(block, end="")
        return 0
    try:
        args.write.write_text(replace_between_markers(args.write.read_text(), block))
    except ValueError as err:
        raise SystemExit(f"{args.write}: {err}") from None
    rows = (len(by_shape(doc["rows"])) if args.summary
            else len(selected(doc["rows"], args.recipes, args.paths)))
    print(f"{args.write}: table of {rows} rows written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
