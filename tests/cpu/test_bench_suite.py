"""scripts/bench_suite.py (`bench_moe.py --suite`) on CPU: the plan and its time estimate, the
recipes and refusals per kernel path, the rows' figures and speedups, the output folder's
name and files, and the command line."""

import argparse
import datetime
import json
import sys
from pathlib import Path

import pytest

from mok_megatron.config import load_model, load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_moe  # noqa: E402
import bench_suite  # noqa: E402
import bench_table  # noqa: E402

PEAKS = {"grouped_gemm_flops": 600e12, "hbm_bytes_per_s": 3e12,
         "nvlink_bytes_per_s": float("nan")}


def test_default_suite_fits_ten_minutes_on_one_gpu():
    args = bench_moe.parse_args(["--suite"])
    lines, total = bench_suite.plan_lines(bench_suite.suite_shapes(), bench_suite.RECIPES,
                                          args.iters, args.warmup, world=1)
    assert total < bench_suite.TIME_LIMIT_S
    assert len(lines) == len(bench_suite.SHAPES) + 2


def test_suite_shapes():
    """What the issues ask for: Qwen3-30B-A3B-like E=128 and EP64, DeepSeek-V3-like E=256 and
    EP64 (E=8), MoK's EP64, each at 4096 and 8192 tokens; few experts with a large FFN; H not a
    multiple of 128; a small token count. Every shape's H and F are multiples of 8 (the
    kernels' bound) and its experts split over one GPU."""
    shapes = {(s.model, s.variant, s.tokens) for s in bench_suite.SHAPES}
    for model, variant in (("qwen3_30b_a3b_like", "full"), ("qwen3_30b_a3b_like", "ep64"),
                           ("deepseek_v3_like", "full"), ("deepseek_v3_like", "ep64"),
                           ("mok_bench", "ep64")):
        assert {(model, variant, 4096), (model, variant, 8192)} <= shapes
    models = {s.model: load_model(s.model) for s in bench_suite.SHAPES}
    assert any(m.num_experts <= 8 and m.moe_ffn_hidden_size >= 8192 for m in models.values())
    assert any(m.hidden_size % 128 for m in models.values())
    assert min(s.tokens for s in bench_suite.SHAPES) <= 512
    for m in models.values():
        assert m.hidden_size % 8 == 0 and m.moe_ffn_hidden_size % 8 == 0
    assert load_model("deepseek_v3_like").ep64_equivalent(1).num_experts == 8
    assert len(shapes) == len(bench_suite.SHAPES)


def test_suite_shapes_narrowed():
    shapes = bench_suite.suite_shapes(["deepseek_v3_like"], [8192])
    assert [(s.variant, s.tokens) for s in shapes] == [("ep64", 8192), ("full", 8192)]
    with pytest.raises(SystemExit, match="no suite shape"):
        bench_suite.suite_shapes(["tiny"])


def test_configurations_baselines_first():
    configs = bench_suite.configurations(bench_suite.RECIPES)
    assert configs[:2] == [("bf16", "alltoall"), ("bf16", "flex+hybridep")]
    assert len(configs) == 2 + 3 * 4
    # The shipped recipes' "auto": the forward megakernel at EP = 1, separate at EP > 1, and
    # separate forward under an FP8 recipe with saved backward inputs (config.resolve_kernels).
    assert bench_suite.default_paths(bench_suite.RECIPES, 1) == {
        "bf16": "fwd_megakernel", "mxfp8": "fwd_megakernel", "fp8_blockwise": "fwd_megakernel"}
    assert bench_suite.default_paths(bench_suite.RECIPES, 2) == {
        "bf16": "separate", "mxfp8": "separate", "fp8_blockwise": "separate"}
    assert bench_suite.default_paths(bench_suite.RECIPES, 1, "saved") == {
        "bf16": "fwd_megakernel", "mxfp8": "separate", "fp8_blockwise": "separate"}


@pytest.mark.parametrize("recipe", bench_suite.RECIPES)
@pytest.mark.parametrize("path", bench_suite.PATHS)
def test_every_shipped_recipe_runs_every_path(recipe, path):
    """As shipped (recomputed backward inputs, auto MXFP8 weights) no recipe refuses a path;
    only the kernels and the workspace bound change."""
    kernels = bench_suite.path_recipe(recipe, path, 4096)
    shipped = load_recipe(recipe)
    assert (kernels.kernel.forward_kernel, kernels.kernel.backward_kernel) == \
        bench_suite.PATHS[path]
    assert kernels.kernel.max_tokens_per_rank == 4096
    assert kernels.precision == shipped.precision
    assert kernels.kernel.comm_sms_forward == shipped.kernel.comm_sms_forward
    assert bench_suite.refusal(kernels) is None


def test_saved_backward_inputs_refuse_fp8_megakernels():
    """--backward-inputs saved: the FP8 recipes refuse their megakernels, by config's reason."""
    refused = {(r, p): bench_suite.refusal(bench_suite.path_recipe(r, p, 4096, "saved"))
               for r in bench_suite.RECIPES for p in bench_suite.PATHS}
    assert [k for k, why in refused.items() if why] == [
        (r, p) for r in ("mxfp8", "fp8_blockwise")
        for p in ("fwd_megakernel", "bwd_megakernel", "megakernels")]
    assert refused[("mxfp8", "megakernels")].startswith(
        "refused: kernel.backward_inputs: the backward megakernel under mxfp8")


@pytest.mark.parametrize("name, gpus, slug", [
    ("NVIDIA H100 80GB HBM3", 1, "h100"),
    ("NVIDIA H200", 1, "h200"),
    ("NVIDIA H100 80GB HBM3", 2, "h100x2"),
    ("NVIDIA GH200 480GB", 1, "gh200"),
    ("NVIDIA A100-SXM4-80GB", 1, "a100"),
    ("Some Card", 1, "some-card"),
])
def test_card_slug(name, gpus, slug):
    assert bench_suite.card_slug(name, gpus) == slug


def test_default_out_dir():
    path = bench_suite.default_out_dir("NVIDIA H100 80GB HBM3", 1, datetime.date(2026, 12, 7))
    assert path == bench_moe.REPO / "benchmarks" / "results" / "h100-2026-12-07"


def test_check_result():
    ok = bench_suite.check_result({"y": 1e-3, "dx": 5e-3}, 2e-2, "bf16 alltoall")
    assert ok == {"against": "bf16 alltoall", "rel_l2": {"y": 1e-3, "dx": 5e-3}, "worst": 5e-3,
                  "tolerance": 2e-2, "passed": True}
    assert not bench_suite.check_result({"y": 0.3}, 0.15, "a")["passed"]
    nan = bench_suite.check_result({"y": float("nan"), "dx": 1e-3}, 2e-2, "a")
    assert not nan["passed"] and nan["worst"] != nan["worst"]


def measured(fwd_s, both_s):
    return {"fwd_s": fwd_s, "both_s": both_s, "bwd_s": both_s - fwd_s,
            "peak_fwd_bytes": 2 * 2**30, "peak_both_bytes": 5 * 2**30,
            "kept_for_backward_bytes": 2**29}


def shape_row(recipe, path, m=None, status="ok", tokens=4096):
    model = load_model("qwen3_30b_a3b_like")
    roofs = {"fwd": bench_moe.roofline(model, tokens * 8, 0, 128, PEAKS, False),
             "fwd_bwd": bench_moe.roofline(model, tokens * 8, 0, 128, PEAKS, True)}
    row = {"model": model.name, "variant": "full", "experts": 128, "tokens": tokens,
           "recipe": recipe, "path": path, "status": status, "check": None,
           "roofline": {k: bench_suite.roofline_fields(v) for k, v in roofs.items()}}
    if m is not None:
        row.update(bench_suite.measured_fields(m, roofs, grad_bytes=2**30))
    return row


def test_measured_fields():
    row = shape_row("bf16", "separate", measured(1e-3, 4e-3))
    assert (row["fwd_ms"], row["bwd_ms"], row["fwd_bwd_ms"]) == pytest.approx((1, 3, 4))
    assert row["peak_fwd_gib"] == 2 and row["peak_fwd_bwd_gib"] == 4  # gradients excluded
    assert row["kept_for_backward_gib"] == 0.5
    flops = 18 * 4096 * 8 * 2048 * 768
    assert row["tflops_fwd_bwd"] == pytest.approx(flops / 4e-3 / 1e12)
    floor = row["roofline"]["fwd_bwd"]["floor_ms"]
    assert row["roofline_pct_fwd_bwd"] == pytest.approx(100 * floor / 4)


def test_speedups_over_alltoall_and_the_default_path():
    rows = [shape_row("bf16", "alltoall", measured(2e-3, 8e-3)),
            shape_row("bf16", "flex+hybridep", status="unavailable: no HybridEP"),
            shape_row("bf16", "separate", measured(1e-3, 4e-3)),
            shape_row("bf16", "megakernels", measured(0.5e-3, 2e-3)),
            shape_row("mxfp8", "separate", measured(1e-3, 5e-3)),
            shape_row("mxfp8", "megakernels", status="refused: no"),
            shape_row("bf16", "separate", measured(1e-3, 4e-3), tokens=512)]
    out = bench_suite.with_speedups(rows, {"bf16": "separate", "mxfp8": "separate"})
    by = {(r["recipe"], r["path"], r["tokens"]): r for r in out}
    mk = by[("bf16", "megakernels", 4096)]
    assert mk["speedup_vs_alltoall"] == pytest.approx({"fwd": 4, "bwd": 4, "fwd_bwd": 4})
    assert mk["speedup_vs_default"] == pytest.approx({"fwd": 2, "bwd": 2, "fwd_bwd": 2})
    assert by[("bf16", "alltoall", 4096)]["speedup_vs_default"]["fwd_bwd"] == 0.5
    assert by[("mxfp8", "separate", 4096)]["speedup_vs_default"]["fwd_bwd"] == 1
    assert by[("mxfp8", "separate", 4096)]["speedup_vs_alltoall"]["fwd_bwd"] == 8 / 5
    assert by[("mxfp8", "megakernels", 4096)]["speedup_vs_alltoall"] is None
    assert by[("bf16", "separate", 512)]["speedup_vs_alltoall"] is None  # no alltoall there


def test_format_row():
    row = bench_suite.with_speedups([shape_row("bf16", "alltoall", measured(2e-3, 8e-3)),
                                     shape_row("bf16", "separate", measured(1e-3, 4e-3))],
                                    {"bf16": "separate"})[1]
    row["check"] = bench_suite.check_result({"y": 3e-3}, 2e-2, "bf16 alltoall")
    line = bench_suite.format_row(row)
    assert "fwd    1.00 bwd    3.00 fwd+bwd    4.00 ms" in line
    assert "x2.00 vs alltoall" in line and "rel-L2 3.0e-03 <= 0.02" in line
    refused = shape_row("mxfp8", "megakernels", status="refused: kernel.x: why")
    assert bench_suite.format_row(refused).endswith(
        "mxfp8         megakernels    refused: kernel.x: why")


def test_arguments():
    suite = bench_moe.parse_args(["--suite"])
    assert (suite.iters, suite.warmup, suite.models, suite.backward_inputs) == (5, 2, None, None)
    assert (bench_moe.parse_args(["--suite", "--iters", "7", "--warmup", "0"]).iters,
            bench_moe.parse_args(["--suite", "--warmup", "0"]).warmup) == (7, 0)
    plain = bench_moe.parse_args([])
    assert (plain.iters, plain.warmup, plain.models, plain.backward_inputs) == (
        10, 3, bench_moe.DEFAULT_MODELS, "recomputed")
    assert bench_moe.parse_args(["--recipe", "mxfp8"]).mxfp8
    with pytest.raises(SystemExit):
        bench_moe.parse_args(["--dry-run"])


def test_dry_run_prints_the_plan(capsys):
    bench_moe.main(["--suite", "--dry-run", "--models", "mixtral_8x7b_like", "--recipe", "bf16"])
    out = capsys.readouterr().out
    assert out.startswith("benchmark suite plan:")
    assert "mixtral_8x7b_like    full  T=4096  6 configurations" in out
    assert "estimated total" in out


def suite_meta(shapes):
    args = argparse.Namespace(iters=5, warmup=2, seed=0, backward_inputs=None)
    return bench_suite.run_meta(args, "NVIDIA H100 80GB HBM3", 1, PEAKS,
                                {"flex+hybridep": "skipped: No module named 'deep_ep'"},
                                bench_suite.RECIPES, shapes, 250.0)


def test_writer_outputs(tmp_path):
    """COMMAND.txt at once; results.json after every row, with the speedups the later rows
    complete; README.md (with bench_table's table) and chart.png after the shape."""
    pytest.importorskip("matplotlib")
    shapes = bench_suite.suite_shapes(["qwen3_30b_a3b_like"], [4096])[:1]
    writer = bench_suite.SuiteWriter(tmp_path, suite_meta(shapes), {"bf16": "separate"})
    command = (tmp_path / "COMMAND.txt").read_text()
    assert "card     1x NVIDIA H100 80GB HBM3" in command and "torch    " in command
    writer.add(shape_row("bf16", "alltoall", measured(2e-3, 8e-3)))
    writer.add(shape_row("bf16", "flex+hybridep", status="unavailable: no HybridEP"))
    row = writer.add(shape_row("bf16", "separate", measured(1e-3, 4e-3)))
    assert row["speedup_vs_alltoall"]["fwd_bwd"] == 2
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["rows"][0]["speedup_vs_default"]["fwd_bwd"] == 0.5  # completed by a later row
    assert doc["meta"]["complete"] is False and doc["meta"]["iters"] == 5

    writer.shape_done(12.0, complete=True)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["meta"]["complete"] and doc["meta"]["elapsed_s"] == 12.0
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    readme = (tmp_path / "README.md").read_text()
    assert bench_table.render_table(doc) in readme
    assert "Not run: 0 refused, 1 unavailable, 0\nfailed" in readme
    assert not list(tmp_path.glob("*.tmp"))


def test_chart_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    note = bench_suite.draw_chart([], tmp_path / "chart.png")
    assert note.startswith("chart skipped:") and "bench" in note
    assert not (tmp_path / "chart.png").exists()


def test_started_without_torchrun_it_runs_under_torchrun(monkeypatch):
    """One process per visible GPU, multicast off, the command as typed passed along."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(sys, "argv", ["scripts/bench_moe.py", "--suite"])
    monkeypatch.setattr(bench_moe.torch.cuda, "device_count", lambda: 2)
    calls = []
    monkeypatch.setattr(bench_moe.subprocess, "call",
                        lambda cmd, env: calls.append((cmd, env)) or 3)
    with pytest.raises(SystemExit) as ended:
        bench_moe.main(["--suite", "--out", "/tmp/x y"])
    assert ended.value.code == 3  # torchrun's status
    (cmd, env), = calls
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[5].endswith("scripts/bench_moe.py")
    assert cmd[6:] == ["--suite", "--out", "/tmp/x y"]
    assert all(env[k] == v for k, v in bench_moe.MULTICAST_OFF.items())
    assert env[bench_moe.COMMAND_ENV] == "python scripts/bench_moe.py --suite --out '/tmp/x y'"
    monkeypatch.setenv(bench_moe.COMMAND_ENV, env[bench_moe.COMMAND_ENV])
    assert bench_moe.command_line(2) == env[bench_moe.COMMAND_ENV]

    monkeypatch.setattr(bench_moe.torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench_moe.main(["--suite"])


def test_hybridep_refuses_an_expert_count_it_cannot_take(monkeypatch):
    """HybridEP asserts "The config is not valid" at its first dispatch unless experts per rank
    x ranks per NVLink domain is a multiple of 4 (6 experts at EP=1, 1×H100 2026-12-07): the
    suite records a refusal naming that, before anything is built."""
    monkeypatch.setattr(bench_suite.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(bench_moe.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(bench_moe.dist, "get_rank", lambda: 0)
    model = load_model("mok_bench")
    fn, status = bench_suite.build("bf16", "flex+hybridep", model, 6, 4096, None, None)
    assert fn is None
    assert status == ("refused: HybridEP needs experts per rank x ranks per NVLink domain to "
                      "be a multiple of 4: 6 x 1")
