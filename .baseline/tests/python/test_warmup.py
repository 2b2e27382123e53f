"""normjit.warmup: records a model's instance-norm calls and compiles (and loads) their kernels.

Recording tests run in process with _C.warmup_calls stubbed out: they need the binding, no NVRTC.
Compile tests need NVRTC (no GPU): they compile for the built-in H200 profile into a temporary
disk cache, each warm-up in a subprocess because the cache directory is read once per process.
The GPU test checks the point of it all: after warmup, the first real step compiles nothing.
"""
import json
import os
import re
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import normjit  # noqa: E402
import normjit.functional as NF  # noqa: E402

nn = torch.nn

# The model, as source: the compile tests run it in subprocesses too.
MODEL_SRC = '''
import torch
import normjit
import normjit.functional as NF
nn = torch.nn

class ResBlock(nn.Module):  # a normjit module given a residual
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv3d(c, c, 3, padding=1)
        self.norm = normjit.nn.InstanceNorm3d(c, affine=True, activation="leaky_relu")

    def forward(self, x):
        return self.norm(self.conv(x), residual=x)

class FunctionalTail(nn.Module):  # normjit.functional with a residual, outside any normjit module
    def forward(self, x):
        return NF.instance_norm(x, residual=x, activation="relu")

def build_model():
    """A 3D U-Net-like encoder block: conv-norm-act, residual block, strided conv-norm-act."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv3d(4, 8, 3, padding=1), nn.InstanceNorm3d(8, affine=True), nn.LeakyReLU(),
        ResBlock(8),
        nn.Conv3d(8, 16, 3, stride=2, padding=1), nn.InstanceNorm3d(16, affine=True), nn.ReLU(),
        FunctionalTail())
    return normjit.convert(model, verbose=False)
'''
_ns = {}
exec(MODEL_SRC, _ns)
build_model = _ns["build_model"]

# The fusions of build_model's training step (kernel names without the config suffix).
EXPECTED_FUSIONS = {
    "in_fwd_{d}_{l}_train_w{w}_save_leaky_relu", "in_bwd_{d}_{l}_train_w{w}_leaky_relu",
    "in_fwd_{d}_{l}_train_w{w}_res_save_leaky_relu", "in_bwd_{d}_{l}_train_w{w}_res_leaky_relu",
    "in_fwd_{d}_{l}_train_w{w}_save_relu", "in_bwd_{d}_{l}_train_w{w}_relu",
    "in_fwd_{d}_{l}_train_res_save_relu", "in_bwd_{d}_{l}_train_res_relu",
}


def expected_fusions(dtype="f32", layout="ncdhw", weight="f32"):
    return {f.format(d=dtype, l=layout, w=weight) for f in EXPECTED_FUSIONS}


def fusions(names):
    return {re.sub(r"_t\d+g(\d+|f)i\d+v\d+b\d+[cs](32|64)([rp]\d+)?(cl)?$", "", n) for n in names}


def _binding():
    if normjit._ops._C is None:
        pytest.skip(f"normjit._C not built: {normjit._ops._import_error}")
    return normjit._ops._C


@pytest.fixture
def record(monkeypatch):
    """warmup() with the compile step stubbed: returns the recorded calls and the summary."""
    C = _binding()

    def warmup_calls(calls, device, jobs, profile):
        return {"kernels": 0, "compiled": 0, "from_disk": 0, "failed": 0, "errors": [],
                "loaded": False, "seconds": 0.0, "profile": "H200", "arch": 90, "names": []}

    monkeypatch.setattr(C, "warmup_calls", warmup_calls)

    def run(model, x, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the CPU fallback's warnings in real steps
            r = normjit.warmup(model, x, verbose=False, **kwargs)
        assert NF._recorder is None, "the recorder must be removed after warmup"
        return r
    return run


# ------------------------------------------------------------------------------------ recording
def test_records_module_and_functional_calls(record):
    model = build_model()
    params = [p.clone() for p in model.parameters()]
    r = record(model, torch.randn(2, 4, 16, 16, 16))
    assert r["mode"] == "fake"
    calls = r["calls"]
    assert [c["module"] for c in calls] == ["1", "3.norm", "5", ""]
    assert [c["sizes"] for c in calls] == [[2, 8, 16, 16, 16]] * 2 + [[2, 16, 8, 8, 8]] * 2
    assert [c["residual"] for c in calls] == [False, True, False, True]
    assert [c["activation"] for c in calls] == [2, 2, 1, 1]
    assert [c["weight_dtype"] for c in calls] == ["float32"] * 3 + [None]
    assert all(c["dtype"] == "float32" and c["fwd"] and c["bwd"] and c["use_input_stats"]
               and not c["running"] for c in calls)
    assert calls[0]["strides"] == [32768, 4096, 256, 16, 1]
    # the real model is untouched: same parameters, still on the CPU
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_eval_and_backward_false_record_no_backward(record):
    model = nn.Sequential(nn.Conv3d(4, 8, 3, padding=1),
                          normjit.nn.InstanceNorm3d(8, affine=True, track_running_stats=True),
                          nn.Conv3d(8, 8, 3, padding=1), normjit.nn.InstanceNorm3d(8))
    x = torch.randn(2, 4, 8, 8, 8)
    model.eval()
    calls = record(model, x)["calls"]
    # running statistics in eval; the other norm still normalises with the input's statistics
    assert [(c["use_input_stats"], c["running"], c["bwd"]) for c in calls] == \
        [(False, True, False), (True, False, False)]
    model.train()
    assert [c["bwd"] for c in record(model, x)["calls"]] == [True, True]
    assert [c["bwd"] for c in record(model, x, backward=False)["calls"]] == [False, False]


def test_records_channels_last_and_dtypes(record):
    model = build_model().to(memory_format=torch.channels_last_3d)
    x = torch.randn(2, 4, 16, 16, 16).to(memory_format=torch.channels_last_3d)
    calls = record(model, x)["calls"]
    # conv outputs stay channels_last_3d (as cuDNN's do): a meta-device run would lose that
    assert calls[0]["strides"] == [32768, 1, 2048, 128, 8]
    assert all(c["strides"][1] == 1 for c in calls)

    calls = record(build_model(), torch.randn(2, 4, 16, 16, 16), autocast=True)["calls"]
    assert [(c["dtype"], c["weight_dtype"]) for c in calls] == \
        [("float16", "float32")] * 3 + [("float16", None)]
    calls = record(build_model(), torch.randn(2, 4, 16, 16, 16), dtype=torch.bfloat16)["calls"]
    assert {c["dtype"] for c in calls} == {"bfloat16"}

    calls = record(build_model().half(), torch.randn(2, 4, 16, 16, 16).half())["calls"]
    assert [(c["dtype"], c["weight_dtype"]) for c in calls] == \
        [("float16", "float16")] * 3 + [("float16", None)]


class _DataDependent(nn.Module):
    """A forward that fake tensors cannot run (it reads a value)."""

    def forward(self, x):
        return x * 2 if x.abs().max().item() > 0 else x


def test_falls_back_to_a_real_step_and_restores_the_model(record):
    model = nn.Sequential(
        nn.Conv3d(4, 8, 3, padding=1),
        normjit.nn.InstanceNorm3d(8, affine=True, track_running_stats=True, activation="relu"),
        _DataDependent())
    weight = model[0].weight
    weight.grad = torch.full_like(weight, 7.0)
    grad = weight.grad
    running = model[1].running_mean.clone()

    r = record(model, torch.randn(2, 4, 8, 8, 8))
    assert r["mode"].startswith("real step: the fake-tensor trace failed"), r["mode"]
    assert len(r["calls"]) == 1 and r["calls"][0]["bwd"] and r["calls"][0]["running"]
    # gradients and running statistics are as they were before the step
    assert weight.grad is grad and torch.all(grad == 7.0)
    assert model[1].weight.grad is None
    assert torch.equal(model[1].running_mean, running)
    assert "recorded by one real step" in sys.modules["normjit.warmup"]._summary(r, None)


# ------------------------------------------------------------------------- compiling (NVRTC)
_SCRIPT = MODEL_SRC + '''
import json, sys
opts = json.loads(sys.argv[1])
model = build_model()
x = torch.randn(2, 4, 16, 16, 16)
if opts.get("channels_last"):
    model = model.to(memory_format=torch.channels_last_3d)
    x = x.to(memory_format=torch.channels_last_3d)
if opts.get("half"):
    model, x = model.half(), x.half()
if opts.get("autotune"):
    normjit.autotune(True)
r = normjit.warmup(model, x, verbose=False, autocast=opts.get("autocast"))
r.pop("calls")
print("RESULT " + json.dumps(r))
'''


def _warmup_subprocess(cache_dir, **opts):
    ok, why = _binding().nvrtc_available()
    if not ok:
        pytest.skip(f"NVRTC cannot be loaded, nothing to compile with: {why}")
    env = dict(os.environ, NORMJIT_CACHE_DIR=str(cache_dir))
    env.pop("NORMJIT_DISABLE_DISK_CACHE", None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # compile-only, also on a GPU machine
    p = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(opts)], env=env,
                       capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"warm-up subprocess failed:\n{p.stdout}\n{p.stderr}"
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["failed"] == 0 and not r["loaded"] and r["profile"] == "H200", r
    return r


def test_warmup_compiles_then_reads_from_disk(tmp_path):
    first = _warmup_subprocess(tmp_path)
    assert fusions(first["names"]) == expected_fusions()
    assert first["kernels"] == len(first["names"]) == 8
    assert (first["compiled"], first["from_disk"]) == (8, 0)
    assert len(os.listdir(tmp_path)) >= 8

    second = _warmup_subprocess(tmp_path)
    assert second["names"] == first["names"]
    assert (second["compiled"], second["from_disk"]) == (0, 8)


def test_autotune_warmup_also_compiles_the_candidates(tmp_path):
    # With autotune on, the first call times every candidate launch: warm-up compiles them all.
    plain = _warmup_subprocess(tmp_path / "plain")
    tuned = _warmup_subprocess(tmp_path / "tuned", autotune=True)
    assert set(plain["names"]) < set(tuned["names"])
    assert fusions(tuned["names"]) == fusions(plain["names"])
    assert tuned["failed"] == 0 and tuned["compiled"] == len(tuned["names"])


def test_channels_last_3d_yields_ndhwc_kernels(tmp_path):
    r = _warmup_subprocess(tmp_path, channels_last=True)
    assert fusions(r["names"]) == expected_fusions(layout="ndhwc")


def test_fp16_yields_f16_kernels(tmp_path):
    r = _warmup_subprocess(tmp_path, half=True)
    assert fusions(r["names"]) == expected_fusions(dtype="f16", weight="f16")
    r = _warmup_subprocess(tmp_path, autocast=True)  # fp32 parameters, fp16 activations
    assert fusions(r["names"]) == expected_fusions(dtype="f16", weight="f32")


def test_warmup_calls_rejects_bad_calls():
    C = _binding()
    with pytest.raises(ValueError, match="dtype 'float64'"):
        C.warmup_calls([{"sizes": [2, 8, 4, 4], "dtype": "float64"}], None, 1, None)
    with pytest.raises(ValueError, match="call 0"):  # the runtime's own validation
        C.warmup_calls([{"sizes": [2, 8], "dtype": "float32"}], None, 1, None)


# ---------------------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("channels_last,autocast", [(False, False), (True, True)])
def test_first_step_after_warmup_compiles_nothing(cuda, channels_last, autocast):
    if not normjit.is_available():
        pytest.skip(f"normjit unavailable: {normjit.unavailable_reason()}")
    model = build_model().to(cuda)
    x = torch.randn(2, 4, 16, 16, 16, device=cuda)
    if channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
        x = x.to(memory_format=torch.channels_last_3d)
    r = normjit.warmup(model, x, autocast=autocast, verbose=False)
    assert r["loaded"] and r["failed"] == 0 and r["mode"] == "fake"
    assert fusions(r["names"]) == expected_fusions(
        dtype="f16" if autocast else "f32", layout="ndhwc" if channels_last else "ncdhw")

    normjit.reset_cache_stats()
    with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
        y = model(x)
    y.float().sum().backward()
    torch.cuda.synchronize()
    info = normjit.cache_info()
    assert info["compiles"] == 0 and info["kernel_misses"] == 0, info
    assert info["kernel_hits"] > 0, info
