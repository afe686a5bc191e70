"""scripts/bench_table.py: the suite's results.json as a markdown table, and the table put
between a file's bench-table markers."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_table  # noqa: E402

META = {"card": "NVIDIA H100 80GB HBM3", "gpus": 1, "commit": "abc1234", "dirty": False,
        "date": "2026-12-07T10:00:00+00:00", "torch": "2.11.0+cu130", "iters": 5, "warmup": 2,
        "command": "python scripts/bench_moe.py --suite", "complete": True,
        "shapes": [{"model": "qwen3_30b_a3b_like", "variant": "full", "tokens": 4096}]}
SHAPE = {"model": "qwen3_30b_a3b_like", "variant": "full", "experts": 128, "tokens": 4096,
         "roofline": {"fwd": {"binding": "tensor"}, "fwd_bwd": {"binding": "hbm"}}}
UNAVAILABLE = "unavailable: HybridEP is not installed | see its README"


def ran(recipe, path, fwd, bwd, check=None, vs=None, vs_default=None):
    return {**SHAPE, "recipe": recipe, "path": path, "status": "ok", "fwd_ms": fwd,
            "bwd_ms": bwd, "fwd_bwd_ms": fwd + bwd, "peak_fwd_bwd_gib": 1.234,
            "tflops_fwd_bwd": 321.6, "roofline_pct_fwd_bwd": 44.6, "check": check,
            "speedup_vs_alltoall": vs, "speedup_vs_default": vs_default}


def not_run(recipe, path, status):
    return {**SHAPE, "recipe": recipe, "path": path, "status": status}


def doc():
    ok = {"worst": 3.1e-3, "tolerance": 2e-2, "passed": True}
    bad = {"worst": 0.21, "tolerance": 0.15, "passed": False}
    return {"meta": dict(META), "rows": [
        ran("bf16", "alltoall", 2.0, 4.0, vs={"fwd_bwd": 1.0}, vs_default={"fwd_bwd": 0.5}),
        not_run("bf16", "flex+hybridep", UNAVAILABLE),
        ran("bf16", "separate", 1.0, 2.0, ok, {"fwd_bwd": 2.0}, {"fwd_bwd": 1.0}),
        ran("mxfp8", "megakernels", 1.5, 2.5, bad, {"fwd_bwd": 1.5}, {"fwd_bwd": 0.9}),
        not_run("fp8_blockwise", "megakernels", "refused: kernel.backward_inputs: set it"),
        not_run("fp8_blockwise", "fwd_megakernel", "refused: kernel.backward_inputs: set it"),
    ]}


def table_rows(text):
    return [line for line in text.splitlines() if line.startswith("| ")][1:]


def test_table_cells():
    text = bench_table.render_table(doc())
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header, rows = lines[0], lines[2:]
    assert header.split(" | ")[0] == "| layer"
    assert len(rows) == 6
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells == ["qwen3_30b_a3b_like full", "128", "4096", "bf16", "separate", "1.00",
                     "2.00", "3.00", "1.23", "322", "45% hbm", "2.00x", "1.00x", "ok 3.1e-03"]
    assert rows[0].rstrip(" |").endswith("reference")  # alltoall: what the others are checked by
    assert "FAIL 2.1e-01 > 0.15" in rows[3]


def test_rows_that_did_not_run_share_footnotes():
    text = bench_table.render_table(doc())
    rows = table_rows(text)
    assert "unavailable [1]" in rows[1]
    assert "refused [2]" in rows[4] and "refused [2]" in rows[5]  # one note for one reason
    notes = [line for line in text.splitlines() if line.startswith("- [")]
    assert notes == ["- [1] unavailable: HybridEP is not installed \\| see its README",
                     "- [2] refused: kernel.backward_inputs: set it"]
    # Every row has as many cells as the header.
    widths = {line.count(" | ") for line in text.splitlines() if line.startswith("| ")}
    assert widths == {len(bench_table.COLUMNS) - 1}


def test_filters():
    text = bench_table.render_table(doc(), recipes=["bf16"], paths=["alltoall", "separate"])
    assert len(table_rows(text)) == 2


def test_source_line():
    d = doc()
    line = bench_table.source_line(d, "benchmarks/results/h100-2026-12-07/results.json")
    assert line.startswith("Measured on 1x NVIDIA H100 80GB HBM3 (EP=1), commit abc1234, "
                           "2026-12-07 UTC")
    assert "`python scripts/bench_moe.py --suite`" in line
    assert line.endswith("Source: `benchmarks/results/h100-2026-12-07/results.json`.")
    d["meta"].update(complete=False, dirty=True,
                     shapes=d["meta"]["shapes"] * 3)
    line = bench_table.source_line(d)
    assert "abc1234 with uncommitted changes" in line
    assert "Partial run: 1 of 3 shapes." in line


def test_replace_between_markers_keeps_the_rest_and_is_idempotent():
    text = f"# Title\n\nbefore\n{bench_table.BEGIN}\nold table\n{bench_table.END}\nafter\n"
    once = bench_table.replace_between_markers(text, "| new |\n")
    assert once == f"# Title\n\nbefore\n{bench_table.BEGIN}\n| new |\n{bench_table.END}\nafter\n"
    assert bench_table.replace_between_markers(once, "| new |\n") == once


@pytest.mark.parametrize("text, problem", [
    ("no markers", "expected one"),
    (f"{bench_table.BEGIN}\n{bench_table.BEGIN}\n{bench_table.END}", "expected one"),
    (f"{bench_table.END}\n{bench_table.BEGIN}", "comes before"),
])
def test_replace_between_markers_refuses(text, problem):
    with pytest.raises(ValueError, match=problem):
        bench_table.replace_between_markers(text, "x")


def test_command_line(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(doc()))
    assert bench_table.main([str(results), "--recipes", "bf16"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Measured on") and len(table_rows(printed)) == 3

    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{bench_table.BEGIN}\n{bench_table.END}\nend\n")
    assert bench_table.main([str(results), "--write", str(readme)]) == 0
    written = readme.read_text()
    assert written.startswith(f"intro\n{bench_table.BEGIN}\nMeasured on")
    assert written.endswith(f"{bench_table.END}\nend\n") and len(table_rows(written)) == 6

    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="README.md: expected one"):
        bench_table.main([str(results), "--write", str(readme)])


def test_summary_one_row_per_shape():
    d = doc()
    d["meta"].update(default_paths={"bf16": "separate", "mxfp8": "megakernels",
                                    "fp8_blockwise": "fwd_megakernel"},
                     paths=["separate", "fwd_megakernel", "bwd_megakernel", "megakernels"])
    rows = table_rows(bench_table.render_summary(d))
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    # alltoall's ms; HybridEP and fp8_blockwise did not run; the fastest mok row is bf16's.
    assert cells == ["qwen3_30b_a3b_like full", "128", "4096", "6.00", "unavailable", "2.00x",
                     "1.50x", "refused", "2.00x (bf16 separate)"]
    printed = bench_table.render(d, summary=True)
    assert printed.startswith("Measured on") and "fastest mok" in printed
