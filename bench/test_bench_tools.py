"""CPU-only tests of bench_policy.py, bench_cold_start.py (and cold_start_child.py's torch-free
parts), their child-process plumbing and their report sections. The GPU children are replaced by
stub scripts that write what the real ones would. Run with `python3 -m pytest bench` or
`python3 bench/test_bench_tools.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_cold_start as bcs  # noqa: E402
import ncu_stalls  # noqa: E402
import phase_clocks  # noqa: E402
import bench_policy as bp  # noqa: E402
import benchlib as bl  # noqa: E402
import cold_start_child  # noqa: E402
import deep_sass_vs_triton  # noqa: E402
import kernel_times  # noqa: E402
import report  # noqa: E402
import same_code  # noqa: E402
import spill_sites  # noqa: E402
from test_benchlib import _raises, fake_kernel_doc  # noqa: E402


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


def _torch_cpu_only() -> bool:
    """torch importable and no GPU: the case where the real children must fail cleanly."""
    try:
        import torch
    except ImportError:
        return False
    return not torch.cuda.is_available()


# --------------------------------------------------------------------------------------------------
# benchlib: child processes
# --------------------------------------------------------------------------------------------------


def test_child_env():
    os.environ["BENCH_TOOLS_TEST_VAR"] = "1"
    try:
        env = bl.child_env({"BENCH_TOOLS_TEST_VAR": None, "NORMJIT_POLICY": "exact", "N": 3})
    finally:
        del os.environ["BENCH_TOOLS_TEST_VAR"]
    assert "BENCH_TOOLS_TEST_VAR" not in env and env["NORMJIT_POLICY"] == "exact"
    assert env["N"] == "3" and env["PATH"] == os.environ["PATH"]


def test_run_child_status_and_timeout():
    ok = bl.run_child([sys.executable, "-c", "import os, sys; sys.exit(os.environ['X'] != 'y')"],
                      env=bl.child_env({"X": "y"}))
    assert ok["returncode"] == 0 and not ok["timed_out"] and bl.child_failure(ok) is None
    bad = bl.run_child([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert bad["returncode"] == 3 and bl.child_failure(bad) == "exit status 3"
    t0 = time.perf_counter()
    slow = bl.run_child([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert time.perf_counter() - t0 < 20
    assert slow["timed_out"] and slow["returncode"] is None
    assert bl.child_failure(slow).startswith("timed out after")


# --------------------------------------------------------------------------------------------------
# bench_policy.py
# --------------------------------------------------------------------------------------------------


def fake_policy_child_doc(policy: str, shapes=bl.QUICK_SHAPES, slow=None, fail=None,
                          with_eager=True) -> dict:
    """results.json of bench_instance_norm.py under one policy: the exact policy 100 µs per
    config, bounded 103 µs except 125 µs on the config `slow`; `fail` fails bounded's check."""
    doc = fake_kernel_doc(shapes=shapes, dtypes=("fp16",))
    doc["measurements"] = [m for m in doc["measurements"]
                           if m["peer"] == "normjit" or (m["peer"] == "eager" and with_eager)]
    for m in doc["measurements"]:
        key = (tuple(m["shape"]), m["dtype"], m["layout"], m["mode"])
        if m["peer"] == "normjit":
            m["median_us"] = 100.0 if policy == "exact" else (125.0 if key == slow else 103.0)
        else:
            m["median_us"] = 1000.0
    for c in doc["checks"]:
        key = (tuple(c["shape"]), c["dtype"], c["layout"], c["mode"])
        c["ok"] = not (policy == "bounded" and key == fail)
    doc["normjit"]["cache_info_end"] = {"compiles": 6 if policy == "bounded" else 9}
    doc["failures"] = 0
    return doc


def test_policy_args():
    args = bp.parse_args([])
    assert args.shapes == list(bl.DEFAULT_SHAPES) and args.dtypes == ["fp16"]
    assert args.layouts == ["ncdhw", "ndhwc"] and args.modes == ["fwd", "fwdbwd"]
    assert args.tolerance == 0.10
    quick = bp.parse_args(["--quick", "--layouts", "ndhwc"])
    assert quick.shapes == list(bl.QUICK_SHAPES) and quick.layouts == ["ndhwc"]
    assert bp.parse_args(["--shapes", "2,8,4,4,4"]).shapes == [(2, 8, 4, 4, 4)]
    assert _raises(lambda: bp.parse_args(["--tolerance", "-1"]), SystemExit)
    assert _raises(lambda: bp.parse_args(["--modes", "bwd"]), ValueError)


def test_policy_child_command():
    args = bp.parse_args(["--quick", "--no-check", "--rep", "50"])
    bounded = bp.child_command("bounded", "/o/bounded", args)
    exact = bp.child_command("exact", "/o/exact", args)
    assert bounded[1] == bp.KERNEL_BENCH
    assert bounded[bounded.index("--peers") + 1] == "eager,normjit"
    assert exact[exact.index("--peers") + 1] == "normjit"
    i = bounded.index("--shapes")
    assert bounded[i + 1:i + 4] == ["2,32,128,128,128", "2,128,32,32,32", "2,320,4,4,4"]
    assert "--no-check" in bounded and "--no-plot" in exact and bounded[-1] == "--no-check"
    assert bounded[bounded.index("--rep") + 1] == "50.0"
    # The child's own parser takes the command as is.
    import bench_instance_norm

    child = bench_instance_norm.parse_args(bounded[2:])
    assert child.shapes == list(bl.QUICK_SHAPES) and child.peers == ["eager", "normjit"]
    assert child.no_check and child.no_plot and child.dtypes == ["fp16"]


def test_policy_compare_summary_table():
    slow = ((2, 32, 128, 128, 128), "fp16", "ndhwc", "fwdbwd")
    fail = ((2, 320, 4, 4, 4), "fp16", "ncdhw", "fwd")
    bounded = fake_policy_child_doc("bounded", slow=slow, fail=fail)
    exact = fake_policy_child_doc("exact")
    next(m for m in exact["measurements"] if m["peer"] == "normjit").update(
        median_us=None, error="RuntimeError: boom")
    rows = bp.compare(bounded, exact, 0.10)
    assert len(rows) == 3 * 2 * 2
    by = {(tuple(r["shape"]), r["dtype"], r["layout"], r["mode"]): r for r in rows}
    assert abs(by[slow]["ratio"] - 1.25) < 1e-9 and by[slow]["within"] is False
    assert by[fail]["check_bounded"] == "FAIL" and by[fail]["check_exact"] == "ok"
    assert rows[0]["ratio"] is None and rows[0]["error"] == "exact: RuntimeError: boom"
    assert rows[1]["within"] is True and rows[1]["eager_us"] == 1000.0
    summary = bp.summarize(rows, 0.10)
    assert summary["measured"] == 11 and summary["within"] == 10
    assert summary["worst_config"] == "2,32,128,128,128 fp16 ndhwc fwdbwd"
    doc = {"tolerance": 0.10, "comparisons": rows, "summary": summary, "device": "FakeGPU",
           "runs": {"bounded": {"kernels_compiled": 6}, "exact": {"kernels_compiled": 9,
                                                                  "failure": "exit status 1"}}}
    table = bp.policy_table(doc).splitlines()
    assert table[0] == ("| shape | dtype | layout | mode | eager µs | bounded µs | exact µs | "
                        "bounded / exact | within 10% | check b / e |")
    assert "| 125 | 100 | 1.25 | NO | ok / ok |" in "\n".join(table)
    assert "| 103 | 100 | 1.03 | yes |" in table[3]
    line = bp.summary_line(doc)
    assert line.startswith("bounded within 10% of exact on 10 of 11 configurations")
    assert "kernels compiled (fresh disk cache each): bounded 6, exact 9" in line
    md = bp.policy_markdown(doc)
    assert "## Problems" in md and "- exact run: exit status 1" in md
    assert "2,320,4,4,4 fp16 ncdhw fwd: check failed" in md
    assert "2,32,128,128,128 fp16 ncdhw fwd: exact: RuntimeError: boom" in md


def test_policy_compare_missing_runs():
    rows = bp.compare(fake_policy_child_doc("bounded", with_eager=False), None, 0.10)
    assert len(rows) == 12 and all(r["ratio"] is None and r["eager_us"] is None for r in rows)
    assert bp.summarize(rows, 0.1)["geomean_ratio"] is None
    assert bp.compare(None, None, 0.1) == []
    assert "not measured by both runs" in "\n".join(bp.problems({"comparisons": rows}))


POLICY_STUB = """
    # Stands in for bench_instance_norm.py: writes the results.json of NORMJIT_POLICY.
    import json, os, sys
    sys.path.insert(0, {here!r})
    from test_bench_tools import fake_policy_child_doc
    args = sys.argv[1:]
    out = args[args.index("--out") + 1]
    policy = os.environ["NORMJIT_POLICY"]
    assert os.path.isdir(os.environ["NORMJIT_CACHE_DIR"]), "fresh cache dir exists"
    with open(os.path.join({log!r}), "a") as f:
        f.write(policy + " " + os.environ["NORMJIT_CACHE_DIR"] + "\\n")
    os.makedirs(out, exist_ok=True)
    slow = ((2, 320, 4, 4, 4), "fp16", "ndhwc", "fwd")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(fake_policy_child_doc(policy, slow=slow), f)
    sys.exit(1 if policy == "exact" and os.environ.get("STUB_FAIL_EXACT") else 0)
"""


def test_policy_run_all_through_stub_processes():
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "calls.log")
        stub = _write(os.path.join(d, "stub.py"), POLICY_STUB.format(here=HERE, log=log))

        def launch(cmd, env=None, timeout=None):
            assert cmd[1] == bp.KERNEL_BENCH
            return bl.run_child([cmd[0], stub] + cmd[2:], env=env, timeout=timeout)

        args = bp.parse_args(["--quick", "--out", os.path.join(d, "out")])
        doc = bp.run_all(args, launch=launch)
        with open(log) as f:
            calls = [line.split() for line in f]
        assert [c[0] for c in calls] == ["bounded", "exact"] and calls[0][1] != calls[1][1]
        assert not any(os.path.exists(c[1]) for c in calls), "the caches are removed"
        assert doc["failures"] == 0 and doc["device"] == "FakeGPU"
        assert doc["runs"]["exact"]["kernels_compiled"] == 9
        assert doc["summary"]["within"] == 11 and doc["summary"]["measured"] == 12
        out = os.listdir(args.out)
        assert sorted(out) == ["bounded", "exact", "policy.json", "policy.md"]
        with open(os.path.join(args.out, "policy.json")) as f:
            assert json.load(f)["summary"]["worst_ratio"] == 1.25
        # A failed run is a failure of the benchmark, with the other run's numbers kept.
        os.environ["STUB_FAIL_EXACT"] = "1"
        try:
            doc = bp.run_all(args, launch=launch)
        finally:
            del os.environ["STUB_FAIL_EXACT"]
        assert doc["failures"] == 1 and doc["runs"]["exact"]["failure"] == "exit status 1"


# --------------------------------------------------------------------------------------------------
# bench_cold_start.py and cold_start_child.py
# --------------------------------------------------------------------------------------------------


def test_cold_args_and_plan():
    args = bcs.parse_args([])
    assert args.patch == (128, 128, 128) and args.compile and args.layouts == ["ncdhw", "ndhwc"]
    assert args.cases == ["cold", "warm", "warmup", "levels"]
    quick = bcs.parse_args(["--quick"])
    assert quick.patch == (64, 64, 64) and not quick.compile
    assert bcs.parse_args(["--quick", "--compile"]).compile
    assert not bcs.parse_args(["--no-compile"]).compile
    assert bcs.parse_args(["--cases", "warm"]).cases == ["cold", "warm"]
    assert _raises(lambda: bcs.parse_args(["--cases", "hot"]), ValueError)
    assert _raises(lambda: bcs.parse_args(["--patch", "80,192,160"]), ValueError)
    plan = [(c.case, c.layout, c.cache) for c in bcs.plan(args)]
    assert plan == [
        ("cold", "ncdhw", "normjit-ncdhw"), ("warm", "ncdhw", "normjit-ncdhw"),
        ("warmup", "ncdhw", "warmup-ncdhw"),
        ("cold", "ndhwc", "normjit-ndhwc"), ("warm", "ndhwc", "normjit-ndhwc"),
        ("warmup", "ndhwc", "warmup-ndhwc"),
        ("levels_compile", "ncdhw", "levels"), ("levels_disk", "ncdhw", "levels"),
        ("compile_cold", "ncdhw", "inductor"), ("compile_warm", "ncdhw", "inductor")]
    assert len(bcs.plan(quick)) == 8
    assert [c.case for c in bcs.plan(bcs.parse_args(["--cases", "levels", "--no-compile"]))] == [
        "levels_compile", "levels_disk"]


def test_cold_child_command_and_environment():
    args = bcs.parse_args(["--quick", "--layouts", "ndhwc", "--warm-steps", "5",
                           "--cudnn-benchmark"])
    child = bcs.Child("warm", "ndhwc", "normjit-ndhwc")
    cmd = bcs.child_command(child, args, "/r/warm.json")
    assert cmd[1] == bcs.CHILD
    parsed = cold_start_child.parse_args(cmd[2:])
    assert parsed.case == "warm" and parsed.layout == "ndhwc" and parsed.result == "/r/warm.json"
    assert parsed.patch == (64, 64, 64) and parsed.warm_steps == 5 and parsed.cudnn_benchmark
    os.environ["NORMJIT_DISABLE_DISK_CACHE"] = "1"
    try:
        env = bcs.child_environment(child, "/caches")
    finally:
        del os.environ["NORMJIT_DISABLE_DISK_CACHE"]
    assert env["NORMJIT_CACHE_DIR"] == "/caches/normjit-ndhwc"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/caches/normjit-ndhwc/inductor"
    assert "NORMJIT_DISABLE_DISK_CACHE" not in env
    assert env["CUDA_CACHE_PATH"] == "/caches/driver-cache-warm-ndhwc", "NVRTC's driver cache starts empty"
    assert env.get("NORMJIT_PREFETCH") == os.environ.get("NORMJIT_PREFETCH"), "cold/warm keep the default"
    levels = bcs.child_environment(bcs.Child("levels_compile", "ncdhw", "levels"), "/caches")
    assert levels["NORMJIT_PREFETCH"] == "0", "a level's sample must not share the CPU with background compiles"
    assert set(cold_start_child.CASES) >= {c.case for c in bcs.plan(bcs.parse_args([]))}


def test_cold_launch_failures():
    with tempfile.TemporaryDirectory() as d:
        args = bcs.parse_args(["--out", d])
        child = bcs.Child("cold", "ncdhw", "normjit-ncdhw")

        def fake_run(write, returncode=0, timed_out=False):
            def run(cmd, env=None, timeout=None):
                assert env["NORMJIT_CACHE_DIR"] == os.path.join(d, "root", "normjit-ncdhw")
                assert timeout == args.timeout
                if write is not None:
                    bl.write_json(cmd[cmd.index("--result") + 1], write)
                return {"returncode": None if timed_out else returncode, "seconds": 1.0,
                        "timed_out": timed_out}
            return run

        root = os.path.join(d, "root")
        rec = bcs.launch(child, args, root, fake_run({"case": "cold", "overhead_ms": 5.0,
                                                      "error": None}))
        assert rec["error"] is None and rec["process"]["returncode"] == 0
        rec = bcs.launch(child, args, root, fake_run({"case": "cold", "error": "RuntimeError: x"},
                                                     returncode=1))
        assert rec["error"] == "RuntimeError: x"
        rec = bcs.launch(child, args, root, fake_run(None, timed_out=True))
        assert rec["error"].startswith("timed out") and rec["case"] == "cold"
        rec = bcs.launch(child, args, root, fake_run(None))
        assert rec["error"] == "the child wrote no result", "a stale result must not be read"


def fake_cold_record(case: str, layout: str = "ncdhw") -> dict:
    """What cold_start_child.py writes for a case, with made-up numbers."""
    rec = {"case": case, "layout": layout, "error": None, "device": "FakeGPU", "torch": "0",
           "import_ms": 80.0, "torch_first_step_ms": 900.0}
    if case.startswith("levels"):
        rec.update(shape=[2, 32, 8, 8, 8], expected={"l1_hit": True, "first_call": True})
        if case == "levels_compile":
            rec.update(l1_hit_us=20.0, l1_issue_us=12.0, l1_miss_us=[30.0, 34.0, 32.0],
                       l3_miss_ms=[25.0, 27.0, 26.0], nvrtc_ms=[24.0, 26.0, 25.0],
                       first_compile_ms=140.0, first_call_ms=180.0,
                       l2_miss_cleared_ms=[0.2, 0.3], l2_miss_cleared_disk_hits=0)
            rec["expected"]["l1_miss"] = False
        else:
            rec.update(l1_hit_us=21.0, l3_hit_ms=[0.5, 0.4, 0.6])
        return rec
    overhead = {"cold": 850.0, "warm": 62.0, "warmup": 3.0, "compile_cold": 45000.0,
                "compile_warm": 9000.0}[case]
    rec.update(first_step_ms=40.0 + overhead, warm_step_ms=40.0, warm_steps_ms=[40.0] * 3,
               overhead_ms=overhead)
    if not case.startswith("compile"):
        compiles = 0 if case == "warm" else 30
        rec.update(compiles=compiles, compile_ms_total=30 * 25.0 if compiles else 0.0,
                   disk_hits=30 if case == "warm" else 0, kernels_loaded=30,
                   counters_warm_steps={})
    if case == "warmup":
        rec.update(warmup_ms=400.0, warmup={"calls": 44, "kernels": 30, "compiled": 30,
                                            "from_disk": 0, "seconds": 0.39})
    return rec


def fake_cold_doc() -> dict:
    results = [fake_cold_record(c.case, c.layout) for c in bcs.plan(bcs.parse_args([]))]
    results[3]["error"] = "RuntimeError: out of memory"
    return {"device": "FakeGPU", "torch": "0", "patch": [128] * 3, "batch": 2,
            "results": results, "levels": bcs.levels_summary(results)}


def test_cold_tables():
    doc = fake_cold_doc()
    assert bcs.cost_ms(doc["results"][2]) == 403.0
    assert bcs.met(doc["results"][0]) is True and bcs.met(doc["results"][1]) is False
    assert bcs.met(doc["results"][2]) is None and bcs.met({"case": "cold"}) is None
    lines = bcs.cold_table(doc).splitlines()
    assert lines[0].startswith("| case | layout | what | cost ms | target ms | met |")
    assert len(lines) == 2 + 8, "levels rows are not in the cold-start table"
    assert lines[2].startswith("| cold | ncdhw | empty disk cache (NVRTC compiles) | 850 | ≤ 1000 "
                               "| yes | 890 | 40.0 | 30 | 750 | 0 | 30 |")
    assert "| warm | ncdhw |" in lines[3] and "| 62.0 | ≤ 50 | NO |" in lines[3]
    assert "warmup() 400 ms: 44 calls, 30 kernels (30 compiled, 0 from disk)" in lines[4]
    assert "ERROR RuntimeError: out of memory" in lines[5]
    assert lines[8].startswith("| compile_cold | ncdhw | peer: torch.compile")
    assert "| 45000 |" in lines[8]
    short = bcs.cold_table(doc, notes=False).splitlines()
    assert short[0].endswith("| kernels loaded |") and "torch's own" not in "\n".join(short)
    lv = doc["levels"]
    assert lv["l1_miss_us"] == 32.0 and lv["l3_miss_ms"] == 26.0 and lv["nvrtc_ms"] == 25.0
    assert lv["l2_miss_l3_hit_ms"] == 0.5 and lv["samples"] == {"l1_miss": 3, "l3_hit": 3,
                                                                 "l3_miss": 3}
    levels = bcs.levels_table(lv)
    assert "| L1 plan (per call) | 20.0 µs" in levels and "+32.0 µs" in levels
    assert "+0.500 ms: an L3 hit" in levels and "the cubin was still in memory" in levels
    assert "+26.0 ms per new kernel (NVRTC alone 25.0 ms" in levels
    assert bcs.levels_notes(lv) == ["counters not as expected in levels_compile.l1_miss"]
    md = bcs.cold_markdown(doc)
    assert md.startswith("# Cold start of an nnU-Net-style 3D U-Net forward+backward")
    assert "## What each cache level costs" in md and "patch 128x128x128" in md
    assert bcs.failures(doc) == ["cold ndhwc: RuntimeError: out of memory"]
    assert bcs.levels_summary([fake_cold_record("cold")]) is None


COLD_STUB = """
    # Stands in for cold_start_child.py: writes the record of its case.
    import os, sys
    sys.path.insert(0, {here!r})
    import benchlib as bl
    from test_bench_tools import fake_cold_record
    import cold_start_child
    args = cold_start_child.parse_args(sys.argv[1:])
    cache = os.environ["NORMJIT_CACHE_DIR"]
    os.makedirs(cache, exist_ok=True)
    if args.case == "warm":  # warm runs on what cold left
        assert os.listdir(cache) == ["kernel.njc"], os.listdir(cache)
    open(os.path.join(cache, "kernel.njc"), "w").close()
    bl.write_json(args.result, fake_cold_record(args.case, args.layout))
"""


def test_cold_run_all_through_stub_processes():
    with tempfile.TemporaryDirectory() as d:
        stub = _write(os.path.join(d, "stub.py"), COLD_STUB.format(here=HERE))

        def run(cmd, env=None, timeout=None):
            assert cmd[1] == bcs.CHILD
            return bl.run_child([cmd[0], stub] + cmd[2:], env=env, timeout=timeout)

        args = bcs.parse_args(["--quick", "--out", os.path.join(d, "out"), "--cache-root",
                               os.path.join(d, "caches")])
        doc = bcs.run_all(args, run=run)
        assert doc["failures"] == 0 and doc["device"] == "FakeGPU"
        assert [r["case"] for r in doc["results"]][:3] == ["cold", "warm", "warmup"]
        assert all(r["process"]["returncode"] == 0 for r in doc["results"])
        assert doc["levels"]["l3_miss_ms"] == 26.0
        assert sorted(os.listdir(args.out)) == ["children", "cold_start.json", "cold_start.md"]
        assert len(os.listdir(os.path.join(args.out, "children"))) == 8
        assert sorted(os.listdir(args.cache_root)) == ["levels", "normjit-ncdhw", "normjit-ndhwc",
                                                      "warmup-ncdhw", "warmup-ndhwc"]


def test_children_fail_cleanly_without_gpu():
    """The real children on this machine: no GPU, so an error record and exit status 1."""
    if not _torch_cpu_only():
        return  # needs torch, and a machine without a GPU
    with tempfile.TemporaryDirectory() as d:
        for case in ("cold", "levels_disk"):
            result = os.path.join(d, f"{case}.json")
            proc = subprocess.run([sys.executable, bcs.CHILD, case, "--result", result],
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 1, proc.stdout + proc.stderr
            with open(result) as f:
                rec = json.load(f)
            assert rec["case"] == case and rec["error"] == "RuntimeError: no CUDA device"


def test_layout_keeping_twin():
    if not _torch_cpu_only():
        return
    import torch

    import bench_unet

    base = bench_unet.build_unet()
    twin = cold_start_child.layout_keeping_twin(base)
    norm_type = torch.nn.modules.instancenorm._InstanceNorm
    assert not any(isinstance(m, norm_type) for m in twin.modules())
    assert sum(isinstance(m, norm_type) for m in base.modules()) == 22, "base left as it was"
    affine = twin.encoder[0][0][1]
    x = torch.randn(2, 32, 4, 4, 4).half().contiguous(memory_format=torch.channels_last_3d)
    y = affine(x)
    assert y.dtype == torch.float16 and y.is_contiguous(memory_format=torch.channels_last_3d)


# --------------------------------------------------------------------------------------------------
# report.py
# --------------------------------------------------------------------------------------------------


def fake_policy_doc(shapes=bl.DEFAULT_SHAPES) -> dict:
    slow = (tuple(shapes[0]), "fp16", "ndhwc", "fwdbwd")
    rows = bp.compare(fake_policy_child_doc("bounded", shapes=shapes, slow=slow),
                      fake_policy_child_doc("exact", shapes=shapes), 0.10)
    return {"device": "FakeGPU", "tolerance": 0.10, "comparisons": rows,
            "summary": bp.summarize(rows, 0.10),
            "runs": {"bounded": {"kernels_compiled": 6}, "exact": {"kernels_compiled": 9}}}


def test_report_merges_policy_and_cold_start():
    with tempfile.TemporaryDirectory() as d:
        policy, cold, out = (os.path.join(d, n) for n in ("policy", "cold", "out"))
        bl.write_json(os.path.join(policy, "policy.json"), fake_policy_doc())
        bl.write_json(os.path.join(cold, "cold_start.json"), fake_cold_doc())
        proc = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--out", out,
                               "--policy", policy, "--cold", cold, "--console"],
                              capture_output=True, text=True, check=True)
        with open(os.path.join(out, "results.json")) as f:
            assert set(json.load(f)) == {"gpu_check", "policy", "cold_start"}
        with open(os.path.join(out, "results.md")) as f:
            md = f.read()
        rows = 4 * len(bl.DEFAULT_SHAPES)  # 2 layouts x fwd, fwd+bwd
        assert "## Bounded vs exact policy" in md and md.count("| fp16 |") == rows
        assert "## Cold start of an nnU-Net-style" in md and "### What each cache level" in md
        console = proc.stdout
        assert "## policy: bounded vs exact | FakeGPU" in console
        assert f"bounded within 10% of exact on {rows - 1} of {rows}" in console
        assert console.count("| NO |") == 1 + 2, "the slow policy row and both warm rows"
        assert "## cold start (U-Net fwd+bwd, batch 2, patch 128x128x128" in console
        assert "!! cold ndhwc: RuntimeError: out of memory" in console
        assert "?? counters not as expected in levels_compile.l1_miss" in console


def test_policy_console_is_capped():
    doc = fake_policy_doc()
    for r in doc["comparisons"]:
        r["within"] = False
    lines = "\n".join(report._policy_console(doc)).splitlines()
    assert sum(line.startswith("| 2,") for line in lines) == 6
    assert f"... ({4 * len(bl.DEFAULT_SHAPES) - 6} more in results.md)" in lines


def test_console_fits_with_every_benchmark():
    """A full default gpu_check (8 shapes x 3 dtypes, activation, host, U-Net, policy on the
    ladder, cold start with the torch.compile pair) must print its tables within the 12,000
    characters a log tail keeps, with room for the step summary printed before them."""
    import bench_unet

    docs = {"kernel": fake_kernel_doc(shapes=bl.DEFAULT_SHAPES, dtypes=("fp16", "bf16", "fp32")),
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
                                   "losses": [1.1, 1.0, 0.9]} for n in bench_unet.VARIANTS[:5]]},
            "policy": fake_policy_doc(),
            "cold_start": fake_cold_doc()}
    console = report.console_summary(docs)
    assert len(console) < 10_500, len(console)


def test_kernel_times_args():
    a = kernel_times.parse_args(["--shapes", "2,32,8,8,8", "1,4,5,6,7", "--dtypes", "bf16,fp32",
                                 "--layouts", "ndhwc", "--modes", "bwd", "--activation", "none"])
    assert a.shapes == [(2, 32, 8, 8, 8), (1, 4, 5, 6, 7)]
    assert a.dtypes == ["bf16", "fp32"] and a.layouts == ["ndhwc"] and a.modes == ["bwd"]
    assert a.activation is None and not a.residual
    for bad in (["--dtypes", "fp64"], ["--layouts", "nchw"], ["--modes", "both"], ["--shapes", "2,x"]):
        proc = subprocess.run([sys.executable, os.path.join(HERE, "kernel_times.py"), *bad],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "expected" in proc.stderr, (bad, proc.stderr)


def test_kernel_times_without_gpu():
    """No GPU: a clear message and exit status 2, not a traceback."""
    if not _torch_cpu_only():
        return
    proc = subprocess.run([sys.executable, os.path.join(HERE, "kernel_times.py"), "--modes", "bwd"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr, proc.stdout + proc.stderr


def test_kernel_times_bandwidth():
    """Bytes each kernel must move, and the timing field --table reads back."""
    shape = (2, 32, 128, 128, 128)
    n = 2 * 32 * 128 ** 3
    assert kernel_times.kernel_bytes(shape, "fp16", "fwd", False, None) == 2 * 2 * n
    assert kernel_times.kernel_bytes(shape, "fp16", "bwd", False, None) == 3 * 2 * n
    assert kernel_times.kernel_bytes(shape, "fp32", "fwd", True, "relu") == 3 * 4 * n  # + residual
    assert kernel_times.kernel_bytes(shape, "bf16", "bwd", True, None) == 4 * 2 * n  # + d(residual)
    assert kernel_times.kernel_bytes(shape, "bf16", "bwd", True, "relu") == 5 * 2 * n  # + residual read
    field = kernel_times.timing("bwd", 291.0, 3 * 2 * n, 4.22)
    assert field == "  bwd    291.0 us (2.77 TB/s, 66 % of copy)", field
    assert kernel_times.timing("fwd", 163.0, 2 * 2 * n, None).endswith("(3.29 TB/s)")
    line = "new              ncdhw 2,32,128,128,128   fp16 act=none residual=0" + field
    assert kernel_times.parse_line(line) == ("new", "ncdhw 2,32,128,128,128 fp16 act=none residual=0", {"bwd": 291.0})
    assert kernel_times.parse_line("new              device-to-device copy: 4.22 TB/s") is None
    plain = "new              ndhwc 2,320,4,4,4        fp16 act=none residual=0 affine=0" + field  # --no-affine
    assert kernel_times.parse_line(plain) == ("new", "ndhwc 2,320,4,4,4 fp16 act=none residual=0 affine=0",
                                              {"bwd": 291.0})


def test_kernel_times_cupti_timer():
    """The cupti timer's per-call grouping (no GPU needed) and its timing field, which --table
    still reads."""
    # 3 calls of a 2-kernel op, records out of order: per call 4+1, 5+2, 3+1 us
    kernels = [(100.0, 104.0), (110.0, 111.0), (200.0, 205.0), (210.0, 212.0), (300.0, 303.0), (306.0, 307.0)]
    assert bl.per_call_kernel_times_us(list(reversed(kernels)), 3) == (5.0, 2)
    assert bl.per_call_kernel_times_us([(0.0, 4.5)], 1) == (4.5, 1)
    for bad_kernels, calls in ((kernels[:5], 3), ([], 3), (kernels, 0)):
        try:
            bl.per_call_kernel_times_us(bad_kernels, calls)
        except ValueError as e:
            assert "calls" in str(e)
        else:
            raise AssertionError(f"{len(bad_kernels)} kernels in {calls} calls accepted")
    field = kernel_times.timing("fwd", 4.1, 1_310_720, 3.0, kernels=1)
    assert field == "  fwd      4.1 us (0.32 TB/s, 11 % of copy, 1 kernel)", field
    assert kernel_times.timing("bwd", 8.0, 1_310_720, None, kernels=2).endswith("(0.16 TB/s, 2 kernels)")
    line = "cupti            ndhwc 2,320,8,8,8        fp16 act=none residual=0" + field
    assert kernel_times.parse_line(line)[2] == {"fwd": 4.1}
    assert kernel_times.parse_args(["--timer", "cupti"]).timer == "cupti"
    assert kernel_times.parse_args([]).timer == "events"
    assert kernel_times.parse_args(["--no-weight-grads"]).no_weight_grads


def test_kernel_times_wrong_outputs():
    assert kernel_times.wrong_outputs("fp16", {"y": 1.2e-3, "dx/dres": 3.4e-3, "dweight": 1e-6}) == []
    assert kernel_times.wrong_outputs("fp16", {"y": 1.2e-3, "dx/dres": 0.5, "dweight": float("nan")}) == \
        ["dx/dres", "dweight"]
    assert kernel_times.wrong_outputs("bf16", {"y": 3e-2}) == []
    assert kernel_times.wrong_outputs("fp32", {"y": 3e-2}) == ["y"]


def test_kernel_times_ab_table():
    """--table: the median of each tag's runs per kernel, ratios to the first tag; other lines ignored."""
    log = "\n".join([
        "=== base (round 1)",
        "base             ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    163.0 us  bwd    296.0 us",
        "new              ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    160.0 us  bwd    290.0 us"
        "  error (relative to max) y 1.2e-03, dx/dres 3.4e-03 (0 kink elements left out), dweight 1.1e-06",
        "base             ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    165.0 us  bwd    298.0 us",
        "base             ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    164.0 us  bwd    900.0 us",
        "new              ndhwc 2,64,64,64,64      bf16 act=leaky_relu residual=1  bwd     99.0 us",
        "a line that is not a timing: fwd 1 us",
    ])
    table = kernel_times.ab_table(log.splitlines()).splitlines()
    assert table[0] == "| kernel | base (µs) | new (µs) | new / base |", table[0]
    rows = {r.split(" | ")[0]: r.split(" | ")[1:] for r in table[2:]}
    assert rows["| ncdhw 2,32,128,128,128 fp16 act=none residual=0 fwd"] == ["164.0 (3 runs)", "160.0", "0.976 |"]
    assert rows["| ncdhw 2,32,128,128,128 fp16 act=none residual=0 bwd"] == ["298.0 (3 runs)", "290.0", "0.973 |"]
    assert rows["| ndhwc 2,64,64,64,64 bf16 act=leaky_relu residual=1 bwd"] == ["-", "99.0", "- |"]
    assert len(rows) == 3
    assert kernel_times.ab_table(["nothing here"]) == ""


def test_kernel_times_ab_table_shows_each_tags_clock():
    """Lines that recorded clocks add a row of each tag's median SM clock; the timings still parse."""
    clocks = "  clocks sm {} MHz, mem 2619 MHz, 60 C, 400 W, throttle 0x0"
    log = [
        "base             ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    205.0 us (2.62 TB/s, 87 % of copy, 1 kernel)"
        + clocks.format(1980) + "  error (relative to max) y 4.0e-04, dx/dres 2.6e-04 (0 kink elements left out), dweight 1.5e-07",
        "new              ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    235.0 us (2.28 TB/s, 76 % of copy, 1 kernel)"
        + clocks.format(1755),
        "new              ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    233.0 us" + clocks.format(1725),
        "new              ncdhw 2,32,128,128,128   fp16 act=none residual=0  fwd    231.0 us" + clocks.format(1740),
    ]
    assert kernel_times.sm_clock_mhz(log[0]) == 1980.0
    assert kernel_times.sm_clock_mhz("base  ncdhw 2,8,8,8,8 fp16 act=none residual=0  fwd 1.0 us") is None
    table = kernel_times.ab_table(log).splitlines()
    assert table[2] == "| ncdhw 2,32,128,128,128 fp16 act=none residual=0 fwd | 205.0 | 233.0 (3 runs) | 1.137 |", table[2]
    assert table[3] == "| SM clock after each timing (MHz, median) | 1980 | 1740 | - |", table[3]
    assert len(table) == 4


_STUB_PYTHON = """\
#!{python}
# Stands in for python3 in compare_baseline.sh: pip installs write a marker, kernel_times.py prints
# a timing that says which tree and which environment ran it, --table runs the real script.
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["-c"]:
    sys.exit(1 if os.environ.get("STUB_NO_NORMJIT") else 0)  # import normjit
if args[:3] == ["-m", "pip", "install"]:
    site, src = args[args.index("--target") + 1] if "--target" in args else None, args[-1]
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write("install " + src + "\\n")
    if "broken" in src:
        print("error: the build failed in " + src)
        sys.exit(1)
    if site:
        os.makedirs(site, exist_ok=True)
        with open(os.path.join(site, "tree.txt"), "w") as f:
            f.write(src)
    sys.exit(0)
if args[0].endswith("kernel_times.py") and args[1] == "--table":
    os.execv({python!r}, [{python!r}] + args)
tag = args[args.index("--tag") + 1]
first = (os.environ.get("PYTHONPATH") or "").split(":")[0]
marker = os.path.join(first, "tree.txt")
tree = open(marker).read() if first and os.path.exists(marker) else "this"
us = json.loads(os.environ["STUB_TIMES"])[tree] - (10 if os.environ.get("NORMJIT_RESIDENT_THREADS") == "128" else 0)
print(f"{{tag:<16}} ncdhw 2,8,8,8,8   fp16 act=none residual=0  fwd {{us:8.1f}} us"
      + ("  WRONG: y above 2e-02" if tag == os.environ.get("STUB_WRONG") else ""))
"""


def test_compare_baseline_extra_trees():
    """COMPARE_TREES: each tree a variant with its own install (one per directory) and its own
    environment, in the A/B table after base, new and the environment variants, ratios to base."""
    with tempfile.TemporaryDirectory() as tmp:
        stub = _write(os.path.join(tmp, "python"), _STUB_PYTHON.format(python=sys.executable))
        os.chmod(stub, 0o755)
        env = dict(os.environ, PYTHON=stub, BENCH="kernel_times", ROUNDS="2", OUT=os.path.join(tmp, "out"),
                   COMPARE_TMP=os.path.join(tmp, "scratch"), STUB_LOG=os.path.join(tmp, "log"),
                   STUB_TIMES=json.dumps({".baseline": 100.0, "this": 90.0, ".v/a": 50.0}),
                   COMPARE_ENVS="NORMJIT_RESIDENT_THREADS=128",
                   COMPARE_TREES="a=.v/a a128=.v/a,NORMJIT_RESIDENT_THREADS=128")
        env.pop("PYTHONPATH", None)
        script = os.path.join(HERE, "compare_baseline.sh")
        proc = subprocess.run([script, ".baseline", "--shapes", "2,8,8,8,8"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        installs = sorted(open(env["STUB_LOG"]).read().split("\n"))
        assert installs == ["", "install .baseline", "install .v/a"], installs
        table = open(os.path.join(tmp, "out", "ab_table.md")).read().splitlines()
        assert table[0] == ("| kernel | base (µs) | new (µs) | new_NORMJIT_RESIDENT_THREADS_128 (µs) | a (µs) | a128 (µs)"
                            " | new / base | new_NORMJIT_RESIDENT_THREADS_128 / base | a / base | a128 / base |"), table[0]
        assert table[2] == ("| ncdhw 2,8,8,8,8 fp16 act=none residual=0 fwd | 100.0 (2 runs) | 90.0 (2 runs) | 80.0 (2 runs)"
                            " | 50.0 (2 runs) | 40.0 (2 runs) | 0.900 | 0.800 | 0.500 | 0.400 |"), table[2]
        # Every run in one log beside the table (the device returns a few files only).
        assert sorted(os.listdir(os.path.join(tmp, "out"))) == ["ab_runs.log", "ab_table.md"]
        runs = open(os.path.join(tmp, "out", "ab_runs.log")).read()
        assert runs.count("fwd ") == 10 and runs.count("a128 ") == 2, runs

        # A variant with wrong outputs fails the run; its table is still written.
        proc = subprocess.run([script, ".baseline"], env=dict(env, STUB_WRONG="a128"), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 1 and "a128-1.log" in proc.stdout and "a-1.log" not in proc.stdout, proc.stdout
        assert "gave WRONG outputs" in proc.stdout and "| a128 / base |" in proc.stdout

        # This tree installs too when normjit is not importable; a failed build stops the run.
        os.remove(env["STUB_LOG"])
        env.update(COMPARE_TREES="a=.v/a bad=.v/broken", STUB_NO_NORMJIT="1")
        proc = subprocess.run([script, ".baseline"], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "install of .v/broken failed" in proc.stdout, proc.stdout + proc.stderr
        assert "the build failed in .v/broken" in proc.stdout and "===" not in proc.stdout
        installs = sorted(open(env["STUB_LOG"]).read().split("\n"))
        assert installs == ["", "install .", "install .baseline", "install .v/a", "install .v/broken"], installs


def _cache_entry(path, name, arch, cubin):
    key = f"normjit 0.1.0\nnvrtc 13.0\narch {arch}\noptions --std=c++17\nsource 0f 10\nname {name}\n".encode()
    with open(path, "wb") as f:
        f.write(same_code.HEADER.pack(same_code.MAGIC, 1, len(key), len(cubin), 0, 0) + key + cubin)


def test_same_code_pairs_kernels_by_name():
    """Entries of two trees pair by kernel name and arch whatever their file names (the source hash);
    a changed, missing or extra kernel fails the comparison."""
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        os.makedirs(a), os.makedirs(b)
        for d, tag in ((a, "1"), (b, "2")):
            _cache_entry(os.path.join(d, tag + "x.njc"), "k_fwd", "sm_90", b"\x7fELF same")
            _cache_entry(os.path.join(d, tag + "y.njc"), "k_fwd", "sm_80", b"\x7fELF same 80")
        assert same_code.main([a, b]) == 0
        _cache_entry(os.path.join(b, "2z.njc"), "k_bwd", "sm_90", b"\x7fELF new")
        _cache_entry(os.path.join(b, "2y.njc"), "k_fwd", "sm_80", b"\x7fELF other")
        r = same_code.compare(same_code.cubins(a), same_code.cubins(b))
        assert r == {"identical": [("k_fwd", "sm_90")], "different": [("k_fwd", "sm_80")], "only_a": [],
                     "only_b": [("k_bwd", "sm_90")]}, r
        assert same_code.main([a, b]) == 1
        with open(os.path.join(a, "bad.njc"), "wb") as f:
            f.write(same_code.MAGIC + b"short")
        assert _raises(lambda: same_code.cubins(a), ValueError)
        assert same_code.main([os.path.join(tmp, "empty"), b]) == 2


def test_phase_clocks_args_and_envs():
    args = phase_clocks.parse_args(["--shapes", "2,32,128,128,128", "1,2,8,8,8"])
    assert args.shapes == [(2, 32, 128, 128, 128), (1, 2, 8, 8, 8)] and not args.no_times
    assert _raises(lambda: phase_clocks.parse_args(["--shapes", "2,x"]), SystemExit)
    # The probe adds its option to the user's; the default build's child gets the user's back.
    probe = phase_clocks.probe_env({"NORMJIT_NVRTC_OPTIONS": "-lineinfo", "HOME": "/h"})
    assert probe == {"NORMJIT_NVRTC_OPTIONS": "-lineinfo -DNJ_PHASE_CLOCKS=1", "HOME": "/h"}
    assert phase_clocks.default_env(probe) == {"NORMJIT_NVRTC_OPTIONS": "-lineinfo", "HOME": "/h"}
    assert phase_clocks.default_env(phase_clocks.probe_env({})) == {}
    every = phase_clocks.probe_env({}, every=1)
    assert every == {"NORMJIT_NVRTC_OPTIONS": "-DNJ_PHASE_CLOCKS=1 -DNJ_PHASE_CLOCKS_EVERY=1"}
    assert phase_clocks.default_env(every) == {}
    assert phase_clocks.parse_args(["--every", "1"]).every == 1 and phase_clocks.parse_args([]).every == 0
    assert _raises(lambda: phase_clocks.parse_args(["--every", "-1"]), SystemExit)
    cmd = phase_clocks.times_command([(2, 32, 128, 128, 128)])
    assert cmd[1].endswith("kernel_times.py") and cmd[-2:] == ["--shapes", "2,32,128,128,128"]
    child = kernel_times.parse_args(cmd[2:])
    assert child.shapes == [(2, 32, 128, 128, 128)] and child.layouts == ["ncdhw"] and child.dtypes == ["fp16"]
    both = phase_clocks.parse_args(["--layouts", "ncdhw,ndhwc"])
    assert both.layouts == ["ncdhw", "ndhwc"]
    assert kernel_times.parse_args(phase_clocks.times_command([(1, 2, 8, 8, 8)], both.layouts)[2:]).layouts == \
        ["ncdhw", "ndhwc"]


def test_ncu_stalls_summarizes_the_source_export():
    header = ('"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_wait",'
              '"stall_long_sb (Not Issued)"')
    text = "\n".join([
        '"Kernel Name","normjit_instance_norm_forward",', header,
        '"0x10","LDG.E.128 R4, [R2]","30","25","5","1"',
        '"0x20","FADD R1, R2, R3","10","0","10","0"',
        '"Kernel Name","normjit_instance_norm_nhwc_forward",', header,
        '"0x30","BAR.SYNC 0x0","0","0","0","0"',
    ])
    blocks = list(ncu_stalls.kernel_blocks(text))
    assert [name for name, _ in blocks] == ["normjit_instance_norm_forward", "normjit_instance_norm_nhwc_forward"]
    assert len(blocks[0][1]) == 2 and blocks[0][1][0]["Source"] == "LDG.E.128 R4, [R2]"
    lines = ncu_stalls.summarize(*blocks[0], top=5)
    assert lines[0] == "## normjit_instance_norm_forward: 2 instructions, 40 samples"
    assert lines[1] == "stalls: long_sb 62.5 %, wait 37.5 %"  # (Not Issued) columns are left out
    assert "75.0 %  long_sb" in lines[3] and "LDG.E.128" in lines[3] and "wait" in lines[4]
    assert ncu_stalls.summarize(*blocks[1], top=5) == ["## normjit_instance_norm_nhwc_forward: 1 instructions, 0 samples"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "source.csv")
        with open(path, "w") as f:
            f.write("not an export\n")
        assert ncu_stalls.main([path]) == 1


def test_phase_clocks_summarizes_channels_last_lines():
    # Two sampled CTAs of one kernel: 1000 cycles over 1000 ns (1 GHz) and 2000 over 1000 (2 GHz).
    lines = [
        "phase_clocks: 2,128,32,32,32 fp16 ndhwc, measured calls",
        "nj_nhwc_phase forward chunks 66 grid 264 cta 0 rounds 1: cycles 1000 = load 400 + reduce 100 + "
        "arrive 200 + merge 100 + merged_arrive 100 + output 100; globaltimer 5000 to 6000 ns",
        "nj_nhwc_phase forward chunks 66 grid 264 cta 33 rounds 1: cycles 2000 = load 800 + reduce 200 + "
        "arrive 400 + merge 200 + merged_arrive 200 + output 200; globaltimer 5500 to 6500 ns",
        "nj_phase forward chunks 147 grid 264 cta 0 steps 9 (counted 1): cycles a step 1 = A 1 + ...",
    ]
    r = phase_clocks.parse_nhwc_line(lines[1])
    assert r["kernel"] == "forward" and r["chunks"] == 66 and r["grid"] == 264 and r["cta"] == 0
    assert r["cycles"]["load"] == 400 and r["start_ns"] == 5000 and r["end_ns"] == 6000
    assert phase_clocks.parse_nhwc_line(lines[0]) is None and phase_clocks.parse_nhwc_line(lines[3]) is None
    (text,) = phase_clocks.summarize(lines)
    # Both CTAs spent 0.4 µs loading (400 cycles at 1 GHz, 800 at 2 GHz).
    assert "2 CTAs sampled" in text and "load 0.40" in text and "arrive 0.20" in text, text
    assert "starts spread 0.50 µs" in text and "first start to last end 1.50 µs" in text, text
    # Since session 24 the line ends with the deep backward's cluster step (0 in older logs).
    assert r["cycles"]["cluster"] == 0
    deep = ("nj_nhwc_phase backward chunks 1 grid 40 cta 33 rounds 1: cycles 1000 = load 500 + reduce 100 + "
            "arrive 0 + merge 0 + merged_arrive 0 + output 300 + cluster 100; globaltimer 0 to 1000 ns")
    assert phase_clocks.parse_nhwc_line(deep)["cycles"]["cluster"] == 100
    assert "cluster 0.10" in phase_clocks.summarize([deep])[0]
    # Since session 25 the line ends with the split's arrivals (no summary line without them).
    assert "arrivals" not in r and len(phase_clocks.summarize(lines)) == 1
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log")
        with open(log, "w") as f:
            f.write("\n".join(lines))
        assert phase_clocks.main(["--summarize", log]) == 0
        with open(log, "w") as f:
            f.write("nothing\n")
        assert phase_clocks.main(["--summarize", log]) == 1


def test_phase_clocks_splits_the_arrivals_into_skew_and_round_trip():
    def line(cta, instance, ready, released, ready2=0, released2=0):
        return (f"nj_nhwc_phase forward chunks 2 grid 4 cta {cta} rounds 1: cycles 1000 = load 1000 + reduce 0 + "
                f"arrive 0 + merge 0 + merged_arrive 0 + output 0 + cluster 0; globaltimer 0 to 1000 ns; "
                f"arrivals instance {instance} ready {ready} released {released} ready2 {ready2} "
                f"released2 {released2}")
    # Instance 0: CTAs ready at 1000 and 3000 ns, both released at 4000: the last was ready at 3000,
    # so the waits (3000 and 1000 ns) are skew 2000 and 0 plus a round trip of 1000 each.
    # Instance 1 has one CTA of its two: its last ready time is unknown, so it is left out.
    rows = [line(0, 0, 1000, 4000, 5000, 6000), line(1, 0, 3000, 4000, 5000, 7000), line(2, 1, 1000, 2000)]
    assert phase_clocks.parse_nhwc_line(rows[0])["arrivals"] == dict(
        instance=0, ready=1000, released=4000, ready2=5000, released2=6000)
    text = phase_clocks.summarize(rows)
    assert text[1] == ("  arrival 1: 2 CTAs of whole instances; mean wait 2.00 µs = skew 1.00 + round trip 1.00 "
                       "(round trip min 1.00, max 1.00)"), text
    assert text[2].startswith("  arrival 2: 2 CTAs of whole instances; mean wait 1.50 µs = skew 0.00 + "
                              "round trip 1.50"), text
    assert len(text) == 3
    # The same instance in another launch (after a header line) is its own instance.
    again = rows[:2] + ["phase_clocks: measured calls", line(0, 0, 90000, 91000), line(1, 0, 90000, 91000)]
    assert "mean wait 1.50 µs = skew 0.50 + round trip 1.00" in phase_clocks.summarize(again)[1]
    # A warm-up launch's lines (which the device may print too) are left out.
    warm = ["phase_clocks: 2,4,8 fp16 ndhwc, warm-up calls", line(0, 0, 0, 9000), line(1, 0, 0, 9000)]
    assert phase_clocks.summarize(warm + again[2:]) == phase_clocks.summarize(again[3:])
    assert phase_clocks.summarize(warm) == []

def test_spill_sites_places_each_spill_in_its_loops():
    # nvdisasm -c -plr -lrm count's layout: an outer loop (0x20-0x70) around an inner one
    # (0x30-0x50); one store before both, one load in the inner loop, one in the outer only.
    listing = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;              // |   1  |
        /*0010*/                   STL [R1], R2 ;                      // |   3  |
.L_x_1:
        /*0020*/                   IADD3 R4, R4, 0x1, RZ ;             // |   4  |
.L_x_2:
        /*0030*/                   LDL R5, [R1] ;                      // |  90  |
        /*0040*/                   FADD R6, R5, R6 ;                   // |  91  |
        /*0050*/               @P0 BRA `(.L_x_2) ;                     // |  91  |
        /*0060*/                   LDL.LU R7, [R1+0x4] ;               // |  12  |
        /*0070*/               @P1 BRA `(.L_x_1) ;                     // |  12  |
        /*0080*/                   BRA `(.L_x_3) ;                     // |   2  |
.L_x_3:
        /*0090*/                   EXIT ;                              // |   1  |
"""
    sites, summary = spill_sites.spill_sites(listing)
    assert [(a, around) for a, _, around in sites] == [
        (0x10, []), (0x30, [(0x20, 6), (0x30, 3)]), (0x60, [(0x20, 6)])]
    # The forward branch to .L_x_3 is no loop; each loop's most live registers.
    assert summary == [(0x20, 0x70, 6, 91), (0x30, 0x50, 3, 91)]


def test_deep_sass_summary_counts_from_a_listing():
    listing = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   I2F.RP R4, R7 ;
        /*0020*/              @!P0 LDG.E.128 R4, desc[UR8][R38.64] ;
        /*0030*/                   SHFL.BFLY PT, R35, R32, 0x10, 0x1f ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/               @P1 STG.E.U16 desc[UR6][R20.64], R3 ;
        /*0060*/                   EXIT ;
"""
    lines = deep_sass_vs_triton.instructions(listing)
    assert lines[2] == "@!P0 LDG.E.128 R4, desc[UR8][R38.64]"
    assert deep_sass_vs_triton.summary("k", lines) == (
        "k: 7 instructions, first LDG at instruction 2; LDG 1, STG 1, SHFL 1, BAR 1, MUFU 0, "
        "integer divide steps (I2F.RP) 1")


def test_env_ab_interleaves_variants_and_tabulates():
    """env_ab.sh: every variant once a round with its variables set (commas join several), the
    rounds interleaved in one log, then kernel_times' table of each tag's median; a failed run is
    noted in the log and the rest go on."""
    with tempfile.TemporaryDirectory() as tmp:
        stub = _write(os.path.join(tmp, "python"), _STUB_PYTHON.format(python=sys.executable))
        os.chmod(stub, 0o755)
        log = os.path.join(tmp, "ab.log")
        env = dict(os.environ, PYTHON=stub, STUB_TIMES=json.dumps({"this": 90.0}), STUB_LOG=os.path.join(tmp, "stub"))
        env.pop("PYTHONPATH", None)
        env.pop("NORMJIT_RESIDENT_THREADS", None)
        proc = subprocess.run([os.path.join(HERE, "env_ab.sh"), log, "2",
                               "default NORMJIT_RESIDENT_THREADS=128,NORMJIT_X=1", "--shapes", "2,8,8,8,8"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        tags = [line.split()[0] for line in open(log).read().splitlines()]
        assert tags == ["default", "NORMJIT_RESIDENT_THREADS=128,NORMJIT_X=1"] * 2, tags
        table = proc.stdout.splitlines()
        assert table[0] == "| kernel | default (µs) | NORMJIT_RESIDENT_THREADS=128,NORMJIT_X=1 (µs) | NORMJIT_RESIDENT_THREADS=128,NORMJIT_X=1 / default |", table[0]
        assert table[2] == "| ncdhw 2,8,8,8,8 fp16 act=none residual=0 fwd | 90.0 (2 runs) | 80.0 (2 runs) | 0.889 |", table[2]

        # A run that fails is recorded and the next one still runs.
        proc = subprocess.run([os.path.join(HERE, "env_ab.sh"), log, "1", "default", "--shapes", "2,8,8,8,8"],
                              env=dict(env, STUB_TIMES="not json"), capture_output=True, text=True, timeout=120)
        assert "env_ab: default, round 1: kernel_times exited 1" in open(log).read(), open(log).read()


def test_gpu_check_ctest_selects_the_gpu_label():
    """gpu_check.sh's ctest step: every test by default, `-L gpu` with GPU_CHECK_CTEST=gpu (the
    label tests/cpp/CMakeLists.txt gives the tests that run kernels), and a clear error for any
    other value. Run on a copy of the script in a scratch tree, with a stub ctest on PATH."""
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "scripts"))
        os.makedirs(os.path.join(tmp, "build-gpu"))
        _write(os.path.join(tmp, "build-gpu", "CTestTestfile.cmake"), "")
        script = os.path.join(tmp, "scripts", "gpu_check.sh")
        with open(os.path.join(HERE, "..", "scripts", "gpu_check.sh")) as f:
            _write(script, f.read())
        bin_dir = os.path.join(tmp, "bin")
        os.makedirs(bin_dir)
        stub = _write(os.path.join(bin_dir, "ctest"),
                      '#!/usr/bin/env bash\necho "ctest args: $*" >> "$STUB_LOG"\necho "100% tests passed out of 3"\n')
        os.chmod(stub, 0o755)
        log = os.path.join(tmp, "stub.log")
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], STUB_LOG=log,
                   OUT=os.path.join(tmp, "out"), GPU_CHECK_TMP=os.path.join(tmp, "scratch"))
        for setting, expected in ((None, "-j8"), ("all", "-j8"), ("gpu", "-j8 -L gpu")):
            run_env = dict(env)
            run_env.pop("GPU_CHECK_CTEST", None)
            if setting:
                run_env["GPU_CHECK_CTEST"] = setting
            proc = subprocess.run(["bash", script, "ctest"], env=run_env, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            last = open(log).read().splitlines()[-1]
            assert last == f"ctest args: --test-dir build-gpu --output-on-failure {expected}", (setting, last)
            summary = open(os.path.join(tmp, "out", "summary.tsv")).read()
            assert "ctest\tok" in summary and "100% tests passed out of 3" in summary, summary

        proc = subprocess.run(["bash", script, "ctest"], env=dict(env, GPU_CHECK_CTEST="fast"),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "GPU_CHECK_CTEST must be all or gpu, not 'fast'" in proc.stderr, proc.stderr


if __name__ == "__main__":
    sys.exit(bl.run_test_functions(globals()))
