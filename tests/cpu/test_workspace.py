"""The symmetric workspace's layout (mok_megatron/workspace.py): regions in order, aligned,
not overlapping; the `inputs` region only where backward recomputes from the token rows."""

from mok_megatron.workspace import WorkspaceLayout


def test_regions_are_aligned_and_disjoint():
    layout = WorkspaceLayout(max_tokens=1000, topk=6, hidden=7168, inputs=True)
    offsets = layout.offsets()
    names = [n for n in offsets if n != "end"]
    starts = [offsets[n] for n in names] + [offsets["end"]]
    assert all(a % 256 == 0 for a in starts)
    assert starts == sorted(starts)
    assert offsets["slots"] - offsets["inputs"] >= 1000 * 7168 * 2
    assert offsets["end"] - offsets["slot_values"] >= 1000 * 6 * 4


def test_inputs_region_only_when_recomputing():
    saved = WorkspaceLayout(max_tokens=512, topk=2, hidden=256)
    recomputed = WorkspaceLayout(max_tokens=512, topk=2, hidden=256, inputs=True)
    assert recomputed.nbytes - saved.nbytes == 512 * 256 * 2
    assert not saved.matches(recomputed) and recomputed.matches(recomputed)
