"""CPU-only tests of the benchmark helpers (no torch, no GPU): byte counting, parsing, tables,
JSON output, the report merge and the plot. Run with `python3 -m pytest bench` or
`python3 bench/test_benchlib.py`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_host_overhead  # noqa: E402
import bench_instance_norm  # noqa: E402
import bench_unet  # noqa: E402
import benchlib as bl  # noqa: E402
import report  # noqa: E402


def _raises(fn, exc=ValueError):
    try:
        fn()
    except exc:
        return True
    return False


# --------------------------------------------------------------------------------------------------
# Synthetic documents
# --------------------------------------------------------------------------------------------------


def fake_kernel_doc(shapes=((2, 32, 128, 128, 128), (2, 320, 4, 4, 4)),
                    dtypes=("fp16", "fp32"), activation="none", fail=None) -> dict:
    """A kernel-benchmark document like bench_instance_norm.py writes, with made-up times:
    eager 10x, compile 2x and normjit 1x of the ideal copy time."""
    copy_tbps = 4.0
    doc = {"device": "FakeGPU", "torch": "0", "triton": "0", "timer": "fake",
           "normjit": {"available": True}, "copy": {"tbps": copy_tbps, "tbps_end": 4.1},
           "measurements": [], "checks": []}
    peers = ["eager", "compile"] + (["normjit_unfused"] if activation != "none" else []) + \
        ["normjit"]
    factor = {"eager": 10.0, "compile": 2.0, "normjit_unfused": 1.5, "normjit": 1.0}
    for shape in shapes:
        for dtype in dtypes:
            for layout in bl.LAYOUTS:
                for mode in bl.MODES:
                    nbytes = bl.ideal_bytes(shape, dtype, mode)
                    copy_us = nbytes / (copy_tbps * 1e12) * 1e6
                    cfg = {"shape": list(shape), "dtype": dtype, "layout": layout, "mode": mode,
                           "activation": activation}
                    for peer in peers:
                        t = copy_us * factor[peer] * 1.25
                        tb = bl.tbps(nbytes, t)
                        doc["measurements"].append(dict(cfg, peer=peer, median_us=t, bytes=nbytes,
                                                        tbps=tb, pct_copy=bl.pct_of(tb, copy_tbps),
                                                        error=None))
                    bad = fail is not None and fail == (tuple(shape), dtype, layout, mode)
                    doc["checks"].append(dict(cfg, peer="normjit", ok=not bad,
                                              worst=0.5 if bad else 1e-3, tol=2e-2, error=None,
                                              max_abs={"y": 0.5 if bad else 1e-3}))
    return doc


# --------------------------------------------------------------------------------------------------
# benchlib
# --------------------------------------------------------------------------------------------------


def test_parse_shape_forms():
    assert bl.parse_shape("2,32,128,128,128") == (2, 32, 128, 128, 128)
    assert bl.parse_shape("(2, 32, 80, 192, 160)") == (2, 32, 80, 192, 160)
    assert bl.parse_shape("2x320x4x4x4") == (2, 320, 4, 4, 4)
    assert _raises(lambda: bl.parse_shape("2,32,128,128"))
    assert _raises(lambda: bl.parse_shape("2,32,a,128,128"))
    assert _raises(lambda: bl.parse_shape("2,0,4,4,4"))


def test_parse_shapes_and_choices():
    assert bl.parse_shapes(["2,32,4,4,4;2,64,4,4,4", "1,1,1,1,1"]) == [
        (2, 32, 4, 4, 4), (2, 64, 4, 4, 4), (1, 1, 1, 1, 1)]
    assert bl.parse_choices("fp16, BF16,fp16", tuple(bl.DTYPE_SIZES), "dtype") == ["fp16", "bf16"]
    assert _raises(lambda: bl.parse_choices("fp8", tuple(bl.DTYPE_SIZES), "dtype"))
    assert _raises(lambda: bl.parse_choices(",", tuple(bl.DTYPE_SIZES), "dtype"))


def test_ideal_bytes():
    shape = (2, 32, 128, 128, 128)
    n = 2 * 32 * 128**3
    assert bl.numel(shape) == n
    assert bl.ideal_bytes(shape, "fp16", "fwd") == 2 * n * 2
    assert bl.ideal_bytes(shape, "fp16", "fwdbwd") == 5 * n * 2
    assert bl.ideal_bytes(shape, "fp32", "bwd") == 3 * n * 4
    assert bl.ideal_bytes(shape, "bf16", "fwd") == bl.ideal_bytes(shape, "fp16", "fwd")


def test_parse_clocks():
    """nvidia-smi's CSV of the clock fields becomes one short phrase; anything else, nothing."""
    assert bl.parse_clocks("1980, 2619, 52, 310.55, 0x0000000000000004\n") == \
        "sm 1980 MHz, mem 2619 MHz, 52 C, 311 W, throttle 0x4"
    assert bl.parse_clocks("1980, 2619, 52, 310") == "sm 1980 MHz, mem 2619 MHz, 52 C, 310 W"
    assert bl.parse_clocks("[N/A], 2619, 52, 310, 0x0") == ""  # a field the driver does not report
    assert bl.parse_clocks("No devices were found") == ""
    assert bl.parse_clocks("") == ""
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = tempfile.mkdtemp()  # no nvidia-smi on it
    try:
        assert bl.gpu_clocks() == ""
    finally:
        os.environ["PATH"] = path


def test_bandwidth_and_speedup():
    # DESIGN.md: the big fp16 forward's memory roofline is ~126 µs at 4.27 TB/s.
    nbytes = bl.ideal_bytes((2, 32, 128, 128, 128), "fp16", "fwd")
    roofline_us = nbytes / 4.27e12 * 1e6
    assert 124 < roofline_us < 128
    assert math.isclose(bl.tbps(nbytes, roofline_us), 4.27)
    assert math.isclose(bl.pct_of(2.0, 4.0), 50.0)
    assert bl.tbps(nbytes, None) is None and bl.tbps(nbytes, 0) is None
    assert bl.speedup(3313, 150) > 22 and bl.speedup(None, 1) is None
    assert math.isclose(bl.geomean([2, 8, None]), 4.0)
    assert bl.geomean([None]) is None


def test_formatting():
    assert bl.fmt_time(6972.4) == "6972" and bl.fmt_time(41.33) == "41.3"
    assert bl.fmt_time(7.254) == "7.25" and bl.fmt_time(None) == bl.DASH
    assert bl.fmt_x(22.08) == "22.1×" and bl.fmt_x(0.854) == "0.85×"
    assert bl.fmt_pct(33.33) == "33.3 %"
    assert bl.fmt_shape((2, 32, 4, 4, 4)) == "2,32,4,4,4"
    table = bl.md_table(["a", "b"], [[1, "x|y"], [2, None]])
    assert table.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | x\\|y |", "| 2 | None |"]
    assert _raises(lambda: bl.md_table(["a"], [[1, 2]]))


def test_short_error():
    msg = bl.short_error(RuntimeError("CUDA out of memory.\nTried to allocate"))
    assert msg == "RuntimeError: CUDA out of memory."
    assert len(bl.short_error(ValueError("x" * 1000), limit=50)) == 50


def test_write_json_sanitizes_and_is_atomic():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sub", "r.json")
        bl.write_json(path, {"a": float("nan"), "b": (1, 2), "c": [float("inf"), 1.5],
                             "d": object(), 3: True})
        with open(path) as f:
            doc = json.load(f)
        assert doc["a"] is None and doc["b"] == [1, 2] and doc["c"] == [None, 1.5]
        assert doc["d"].startswith("<object") and doc["3"] is True
        assert os.listdir(os.path.dirname(path)) == ["r.json"]


def test_compile_count():
    assert bl.compile_count({"compiles": 7, "other": 1}) == 7
    assert bl.compile_count({"l3_hits": 2, "nvrtc_compiles": 3}) == 3
    assert bl.compile_count({"compile_time_ms": 5}) is None
    assert bl.compile_count({"error": "x"}) is None and bl.compile_count(None) is None


def test_suspect_and_check_cell():
    assert bl.is_suspect(8e-3, 5e-4) and not bl.is_suspect(8e-4, 5e-5)
    assert not bl.is_suspect(3e-3, 5e-4 * 10) and not bl.is_suspect(None, 1e-3)
    assert bl.check_cell({"ok": True, "worst": 8e-3, "suspect": True}) == "WARN 8.0e-03"
    assert bl.check_cell({"ok": True, "worst": 8e-4}) == "ok 8.0e-04"
    assert bl.check_cell({"ok": False, "worst": 0.5}) == "FAIL 5.0e-01"
    assert bl.check_cell({"ok": False, "error": "x"}) == "error" and bl.check_cell(None) == "—"


def test_counter_delta():
    before = {"available": True, "compiles": 3, "plan_hits": 10, "compile_ms": [["k", 1.0]],
              "layout_copies": 0}
    after = {"available": True, "compiles": 5, "plan_hits": 10, "compile_ms": [["k", 1.0]],
             "layout_copies": 4, "new": 1}
    assert bl.counter_delta(before, after) == {"compiles": 2, "layout_copies": 4}
    assert bl.counter_delta(None, after) == {}


def test_kernel_table_columns_and_values():
    doc = fake_kernel_doc(fail=((2, 320, 4, 4, 4), "fp32", "ndhwc", "fwd"))
    table = bl.kernel_table(doc)
    lines = table.splitlines()
    assert lines[0] == ("| shape | dtype | layout | mode | eager µs | compile µs | normjit µs | "
                        "normjit TB/s | % of copy | × vs eager | × vs compile | check |")
    assert len(lines) == 2 + 2 * 2 * 2 * 2
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    assert first[:4] == ["2,32,128,128,128", "fp16", "ncdhw", "fwd"]
    assert first[7] == "3.20" and first[8] == "80.0 %"
    assert first[9] == "10.0×" and first[10] == "2.00×" and first[11].startswith("ok")
    assert sum("FAIL" in line for line in lines) == 1
    only16 = bl.kernel_table(doc, dtypes=["fp16"]).splitlines()
    assert len(only16) == 2 + 2 * 2 * 2


def test_kernel_table_activation_and_missing_peers():
    doc = fake_kernel_doc(activation="leaky_relu", dtypes=("fp16",))
    header = bl.kernel_table(doc).splitlines()[0]
    assert "normjit unfused µs" in header and "× vs normjit unfused" in header
    # A peer that errored shows a dash, and normjit missing entirely gives no speed-up.
    doc = fake_kernel_doc(dtypes=("fp16",))
    for m in doc["measurements"]:
        if m["peer"] == "compile":
            m.update(median_us=None, tbps=None, pct_copy=None, error="RuntimeError: boom")
    doc["measurements"] = [m for m in doc["measurements"] if m["peer"] != "normjit"]
    row = bl.kernel_table(doc).splitlines()[2]
    assert row.count(bl.DASH) >= 4
    assert len(bl.kernel_errors(doc)) == 8


def test_speedup_summary_and_markdown():
    doc = fake_kernel_doc(fail=((2, 32, 128, 128, 128), "fp16", "ncdhw", "fwdbwd"))
    summary = bl.kernel_speedup_summary(doc)
    assert "| none | fp16 | ncdhw | fwd | 2 | 10.0× | 2.00× | 80.0 % |" in summary
    md = bl.kernel_markdown(doc)
    assert "## InstanceNorm3d kernels" in md and "### Problems" in md
    assert "check 2,32,128,128,128 fp16 ncdhw fwdbwd none: worst 5.0e-01 > tol" in md
    assert len(bl.failed_checks(doc)) == 1


def test_kernel_time_table_and_markdown():
    doc = fake_kernel_doc(dtypes=("fp16",))
    assert "GPU time per call by CUPTI" not in bl.kernel_markdown(doc)  # only with --kernel-times
    for m in doc["measurements"]:
        if tuple(m["shape"]) == (2, 320, 4, 4, 4) and m["mode"] == "fwd" and m["layout"] == "ncdhw":
            if m["peer"] == "eager":
                m["kernel_error"] = "ValueError: an iteration starts with 'x'"
            else:
                m["kernel_us"] = {"compile": 4.0, "normjit": 2.5}[m["peer"]]
                m["gpu_activities_per_call"] = {"compile": 2, "normjit": 1}[m["peer"]]
    table = bl.kernel_time_table(doc).splitlines()
    assert table[0] == ("| shape | dtype | layout | mode | eager GPU µs | compile GPU µs | normjit GPU µs | "
                        "× vs eager | × vs compile |")
    assert len(table) == 3
    row = [c.strip() for c in table[2].strip("|").split("|")]
    assert row == ["2,320,4,4,4", "fp16", "ncdhw", "fwd", "error", "4.00 (2)", "2.50 (1)", bl.DASH, "1.60×"], row
    assert "### GPU time per call by CUPTI" in bl.kernel_markdown(doc)
    assert "normjit call, in launch order" not in bl.kernel_markdown(doc)  # no names recorded


def test_normjit_work_lines_name_every_activity_of_a_call():
    fill = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
    assert bl.short_activity_name("void f<(char)1>(int, float*)") == "f<(char)1>"
    assert bl.short_activity_name(fill, limit=40) == "at::native::vectorized_elementwise_kern…"
    assert bl.short_activity_name("normjit_instance_norm_backward") == "normjit_instance_norm_backward"
    doc = fake_kernel_doc(dtypes=("fp16",))
    for m in doc["measurements"]:
        if m["peer"] == "normjit" and m["mode"] == "fwdbwd" and m["layout"] == "ncdhw":
            m["gpu_activity_names"] = ["normjit_instance_norm_forward", fill, fill,
                                       "normjit_instance_norm_backward"]
            m["kernel_us"], m["gpu_activities_per_call"] = 7.0, 4
    lines = bl.normjit_work_lines(doc)
    assert len(lines) == 1, lines  # one line for every shape with the same work
    assert lines[0].startswith("- ncdhw fwdbwd (2,32,128,128,128; ")
    assert lines[0].endswith("): normjit_instance_norm_forward, " + 2 * (bl.short_activity_name(fill) + ", ")
                             + "normjit_instance_norm_backward")
    assert "### The GPU activities of one normjit call, in launch order" in bl.kernel_markdown(doc)


def test_per_call_times_after_flush():
    # 2 iterations of [flush, a peer's 2 kernels], records out of order: the peer's 3+1 and 2+2 us.
    records = [(0.0, 50.0, "fill"), (60.0, 63.0, "k1"), (64.0, 65.0, "k2"),
               (100.0, 150.0, "fill"), (160.0, 162.0, "k1"), (163.0, 165.0, "k2")]
    assert bl.per_call_times_after_flush(list(reversed(records)), 2, "fill") == (4.0, 2)
    names = []
    assert bl.per_call_times_after_flush(records, 2, "fill", names_out=names) == (4.0, 2)
    assert names == ["k1", "k2"]  # one call's, in launch order
    # A peer whose own kernel has the flush's name is still counted (position, not name, decides).
    same = [(0.0, 50.0, "fill"), (60.0, 61.0, "fill"), (100.0, 150.0, "fill"), (160.0, 161.0, "fill")]
    assert bl.per_call_times_after_flush(same, 2, "fill") == (1.0, 1)
    for bad, calls in ((records[:5], 2), ([], 2), (records, 0), (records[::3], 2),
                       ([records[0], records[1], records[2], records[3]], 2)):  # 2 + 0 kernels
        try:
            bl.per_call_times_after_flush(bad, calls, "fill")
        except ValueError:
            pass
        else:
            raise AssertionError(f"{bad} in {calls} calls accepted")


def test_host_table():
    doc = {"reference_peer": "F.instance_norm", "results": [
        {"peer": "x.add_(0)", "mode": "no_grad", "total_us": 10.0, "issue_us": 9.0},
        {"peer": "F.instance_norm", "mode": "no_grad", "total_us": 60.0, "issue_us": 55.0},
        {"peer": "normjit", "mode": "no_grad", "total_us": 12.0, "issue_us": 11.0},
        {"peer": "x.add_(0)", "mode": "grad", "total_us": 10.0, "issue_us": 9.0},
        {"peer": "F.instance_norm", "mode": "grad", "total_us": 80.0, "issue_us": 70.0},
        {"peer": "normjit", "mode": "grad", "error": "boom"},
    ]}
    lines = bl.host_table(doc).splitlines()
    assert lines[0].startswith("| peer | no_grad µs/call | no_grad issue µs | no_grad × F.")
    assert lines[4] == "| normjit | 12.0 | 11.0 | 0.20 | error | — | — |"


def test_unet_table():
    doc = {"variants": [
        {"name": "eager_ncdhw", "first_step_s": 5.0, "median_ms": 62.0, "losses": [1.1, 1.0, 0.9]},
        {"name": "normjit_ncdhw", "first_step_s": 6.0, "median_ms": 31.0,
         "losses": [1.1001, 1.0, 0.9], "normjit_compiles": 6},
        {"name": "compile_ncdhw", "error": "RuntimeError: x"},
    ]}
    lines = bl.unet_table(doc).splitlines()
    assert "× vs eager_ncdhw" in lines[0]
    assert lines[3].startswith("| normjit_ncdhw | 6.00 | 31.0 | 2.00× | 1.1001 | 0.9000 | 1.0e-04 | 6 |")
    assert lines[4].endswith("RuntimeError: x |")


# --------------------------------------------------------------------------------------------------
# Benchmark scripts' torch-free parts
# --------------------------------------------------------------------------------------------------


def test_bench_instance_norm_args():
    args = bench_instance_norm.parse_args(["--out", "/tmp/x"])
    assert args.shapes == list(bl.DEFAULT_SHAPES) and args.dtypes == ["fp16", "bf16", "fp32"]
    assert args.compile_dtypes == args.dtypes and args.activations == ["none"]
    assert not args.kernel_times and bench_instance_norm.parse_args(["--kernel-times"]).kernel_times
    cfgs = bench_instance_norm.configs(args)
    assert len(cfgs) == len(bl.DEFAULT_SHAPES) * 3 * 2 * 2
    quick = bench_instance_norm.parse_args(["--quick", "--compile-dtypes", "fp16"])
    assert quick.shapes == list(bl.QUICK_SHAPES) and quick.dtypes == ["fp16"]
    explicit = bench_instance_norm.parse_args(["--quick", "--dtypes", "bf16", "--shapes",
                                               "1,2,3,4,5"])
    assert explicit.dtypes == ["bf16"] and explicit.shapes == [(1, 2, 3, 4, 5)]
    mixed = bench_instance_norm.parse_args(["--compile-dtypes", "fp16",
                                            "--activation", "none,leaky_relu"])
    c16 = bench_instance_norm.Config((2, 8, 4, 4, 4), "fp16", "ncdhw", "fwd", "none")
    c32 = bench_instance_norm.Config((2, 8, 4, 4, 4), "fp32", "ncdhw", "fwd", "leaky_relu")
    assert bench_instance_norm.peers_for(c16, mixed) == ["eager", "normjit", "compile"]  # compile last
    assert bench_instance_norm.peers_for(c32, mixed) == ["eager", "normjit_unfused", "normjit"]
    assert len(bench_instance_norm.configs(mixed)) == 2 * len(bl.DEFAULT_SHAPES) * 3 * 2 * 2


def test_bench_unet_args():
    assert bench_unet.parse_patch("128") == (128, 128, 128)
    assert bench_unet.parse_patch("64,96,128") == (64, 96, 128)
    assert _raises(lambda: bench_unet.parse_patch("80,192,160"))
    assert _raises(lambda: bench_unet.parse_patch("32"))
    args = bench_unet.parse_args([])
    assert args.variants == ["eager_ncdhw", "eager_ndhwc", "normjit_ncdhw", "normjit_ndhwc"]
    assert args.patch == (128, 128, 128) and args.steps == 10
    quick = bench_unet.parse_args(["--quick", "--compile"])
    assert quick.patch == (64, 64, 64) and quick.variants[-1] == "compile_ncdhw"


def test_bench_host_args():
    args = bench_host_overhead.parse_args([])
    assert args.calls == 2000 and args.modes == ["no_grad", "grad"]
    assert bench_host_overhead.parse_args(["--quick"]).calls == 500


def test_plot_bandwidth():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return  # the GPU machine has it; a bare CPU machine may not
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bandwidth.png")
        assert bench_instance_norm.plot_bandwidth(fake_kernel_doc(), path)
        assert os.path.getsize(path) > 10_000
        assert not bench_instance_norm.plot_bandwidth(fake_kernel_doc(dtypes=("fp32",)), path)


# --------------------------------------------------------------------------------------------------
# report.py
# --------------------------------------------------------------------------------------------------


def test_report_merges_everything():
    with tempfile.TemporaryDirectory() as d:
        kernel, act, out = (os.path.join(d, n) for n in ("kernel", "act", "out"))
        bl.write_json(os.path.join(kernel, "results.json"), fake_kernel_doc(
            dtypes=("fp16", "bf16", "fp32"), fail=((2, 320, 4, 4, 4), "bf16", "ndhwc", "fwd")))
        bl.write_json(os.path.join(act, "results.json"),
                      fake_kernel_doc(activation="leaky_relu", dtypes=("fp16",)))
        with open(os.path.join(kernel, "bandwidth.png"), "wb") as f:
            f.write(b"png")
        steps = os.path.join(d, "summary.tsv")
        with open(steps, "w") as f:
            f.write("#step\tstatus\tseconds\tnote\ncmake\tok\t41.5\t[57/57] Linking\n"
                    "pytest\tFAILED(1)\t12.0\t1 failed, 3 passed\n")
        proc = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--out", out,
                               "--kernel", kernel, "--kernel-act", act,
                               "--host", os.path.join(d, "missing"), "--steps", steps,
                               "--console"], capture_output=True, text=True, check=True)
        assert sorted(os.listdir(out)) == ["bandwidth.png", "results.json", "results.md"]
        with open(os.path.join(out, "results.json")) as f:
            merged = json.load(f)
        assert set(merged) == {"gpu_check", "kernel", "kernel_activation"}
        assert merged["gpu_check"]["steps"][1] == {"step": "pytest", "status": "FAILED(1)",
                                                   "seconds": 12.0, "note": "1 failed, 3 passed"}
        with open(os.path.join(out, "results.md")) as f:
            md = f.read()
        assert "## Steps" in md and "## InstanceNorm3d + activation kernels" in md
        assert md.count("| bf16 |") >= 8
        console = proc.stdout
        assert "## kernels, fp16" in console and "| bf16 |" not in console.split("geomean")[0]
        assert "!! 1 failed checks" in console and "geomean × vs eager" in console
        assert len(console) < 12_000


def test_report_with_nothing():
    with tempfile.TemporaryDirectory() as d:
        assert report.main(["--out", d, "--kernel", os.path.join(d, "nope")]) == 0
        assert sorted(os.listdir(d)) == ["results.json", "results.md"]


def test_console_fits_for_full_default_run():
    """The default gpu_check run (8 shapes x 3 dtypes plain, 3 shapes fp16 activation, host,
    U-Net) must print its summary tables well within the 12,000 characters a log tail keeps."""
    shapes = bl.DEFAULT_SHAPES
    docs = {"kernel": fake_kernel_doc(shapes=shapes, dtypes=("fp16", "bf16", "fp32")),
            "kernel_activation": fake_kernel_doc(shapes=bl.QUICK_SHAPES, dtypes=("fp16",),
                                                 activation="leaky_relu"),
            "host_overhead": {"shape": [2, 8, 4, 4, 4], "dtype": "fp16", "calls": 2000,
                              "repeats": 5, "results": [
                                  {"peer": p, "mode": m, "total_us": 50.0, "issue_us": 40.0}
                                  for m in ("no_grad", "grad") for p in
                                  ("x.add_(0)", "F.instance_norm", "torch.nn.InstanceNorm3d",
                                   "normjit.functional.instance_norm",
                                   "normjit.nn.InstanceNorm3d",
                                   "torch.compile(InstanceNorm3d)")]},
            "unet": {"patch": [128] * 3, "batch": 2, "steps": 10, "warmup_steps": 3,
                     "variants": [{"name": n, "first_step_s": 5.0, "median_ms": 60.0,
                                   "losses": [1.1, 1.0, 0.9]} for n in bench_unet.VARIANTS[:5]]}}
    console = report.console_summary(docs)
    assert len(console) < 9_500, len(console)


def test_require_gpu_normjit_says_why_not():
    """With stand-ins for torch and normjit: None and a reason on stderr, or the two modules."""
    import contextlib
    import io
    import types

    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    fake_normjit = types.ModuleType("normjit")
    fake_normjit.is_available = lambda: False
    fake_normjit.unavailable_reason = lambda: "libcuda not found"
    saved = {name: sys.modules.get(name) for name in ("torch", "normjit")}
    sys.modules.update(torch=fake_torch, normjit=fake_normjit)
    try:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert bl.require_gpu_normjit("probe") is None
        assert err.getvalue() == "probe: needs a CUDA GPU (none here)\n", err.getvalue()
        fake_torch.cuda.is_available = lambda: True
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert bl.require_gpu_normjit("probe") is None
        assert "normjit is not available: libcuda not found" in err.getvalue(), err.getvalue()
        fake_normjit.is_available = lambda: True
        assert bl.require_gpu_normjit("probe") == (fake_torch, fake_normjit)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


if __name__ == "__main__":
    sys.exit(bl.run_test_functions(globals()))
