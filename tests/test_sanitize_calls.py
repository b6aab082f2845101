"""bench/sanitize_calls.py without a GPU: snapshots give back the views and shared storages they
took, the recorder keeps each variant's smallest distinct calls, and the replay runs exactly those
(its GPU use, under compute-sanitizer, is bench/sanitize.sh's)."""

import importlib.util
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
spec = importlib.util.spec_from_file_location("sanitize_calls", BENCH / "sanitize_calls.py")
sc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sc)

REPLAYED = []


def fake_op(x, out, scale=2.0):
    """An op whose 'launches' name a variant by x's dtype (the recorder reads _local.launched)."""
    launched = getattr(sc._local, "launched", None)
    if launched is not None:
        launched.append(f"fake.dtype-{str(x.dtype).split('.')[-1]}")
    REPLAYED.append(tuple(x.shape))
    out.copy_(x * scale)


def test_snapshot_restores_views_and_shared_storage():
    base = torch.randn(64)
    strided = base[3:43].view(5, 8)[:, 1:6]  # rows 8 apart, 5 wide, at offset 4
    every_other = base[::2]
    ints = torch.randint(-5, 5, (7,), dtype=torch.int32)
    structure, storages, nbytes = sc.snapshot((strided, [every_other, (ints, "x", 3)]), {"dtype": torch.bfloat16})
    assert nbytes == 64 * 4 + 7 * 4 and len(storages) == 2
    base.zero_()  # the snapshot is a copy
    (a, (b, (c, text, n))), kwargs = sc.restore(structure, storages, "cpu")
    assert a.stride() == (8, 1) and a.storage_offset() == 4 and a.shape == (5, 5)
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert float(a.abs().sum()) > 0 and torch.equal(a[0, 0], b[2])
    assert c.dtype == torch.int32 and (text, n, kwargs) == ("x", 3, {"dtype": torch.bfloat16})


def test_recorder_keeps_smallest_distinct_calls_and_replay_runs_them(tmp_path, monkeypatch):
    monkeypatch.setattr(sc, "_has_cuda", lambda x: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(sc, "RECORDS_PER_VARIANT", 2)
    recorder = sc.Recorder(tmp_path)
    op = recorder.wrap(f"{__name__}.fake_op", fake_op)
    for rows in (9, 1, 5, 5, 3):
        x = torch.randn(rows, 4)
        out = torch.empty_like(x)
        op(x, out)
        torch.testing.assert_close(out, x * 2.0)  # the wrapped op still computes
    op(torch.randn(2, 4, dtype=torch.float64), torch.empty(2, 4, dtype=torch.float64))
    kept = recorder.kept
    assert sorted(kept) == ["fake.dtype-float32", "fake.dtype-float64"]
    assert [e[0] for e in kept["fake.dtype-float32"]] == [2 * 1 * 4 * 4, 2 * 3 * 4 * 4]  # the two smallest
    chosen = sc.choose(tmp_path)
    assert len(chosen) == 3 and all(p.exists() for p in chosen)
    REPLAYED.clear()
    assert sc.replay(tmp_path, tmp_path / "variants.txt", device="cpu") == 0
    assert sorted(REPLAYED) == [(1, 4), (2, 4), (3, 4)]


def test_replay_reports_a_call_that_raises(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sc, "_has_cuda", lambda x: True)
    op = sc.Recorder(tmp_path).wrap(f"{__name__}.fake_op", fake_op)
    op(torch.randn(3, 4), torch.empty(3, 4))

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(sys.modules[__name__], "fake_op", broken)
    assert sc.replay(tmp_path, None, device="cpu") == 1
    printed = capsys.readouterr().out
    assert "FAILED" in printed and "RuntimeError: boom" in printed
