"""normjit.autotune on the GPU: results equal torch's, running statistics are updated once, the
next process loads the stored choices instead of searching, and CUDA-graph capture works.

The search-versus-load tests run in subprocesses with their own disk-cache directory (the cache
directory is read once per process, and a fresh one guarantees that the first process searches).
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import normjit  # noqa: E402
import normjit.functional as NF  # noqa: E402

pytestmark = pytest.mark.cuda
F = torch.nn.functional
nn = torch.nn

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4),
       torch.float16: dict(rtol=1e-2, atol=1e-2),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture(autouse=True)
def _require_normjit(cuda):
    if not normjit.is_available():
        pytest.fail(f"a GPU is present but normjit is unavailable: {normjit.unavailable_reason()}")
    torch.backends.cudnn.allow_tf32 = False
    yield


@pytest.fixture
def autotune_on():
    before = normjit.autotune_enabled()
    normjit.autotune(True)
    normjit.clear_memory_caches()  # plans made earlier in the session would skip the tuning
    yield
    normjit.autotune(before)


# Shapes whose calls have several candidate launches: splits with other chunk counts, register-held
# splits, larger tiers, channels-last splits.
CASES = [((1, 2, 128, 128, 128), torch.float16, False),
         ((2, 32, 16, 16, 16), torch.float16, True),
         ((2, 320, 4, 4, 4), torch.float16, False),
         ((1, 2, 32, 32, 32), torch.float32, False),
         ((2, 4, 32, 32, 32), torch.float32, True),
         ((1, 32, 64, 64, 64), torch.bfloat16, True)]


@pytest.mark.parametrize("shape,dtype,channels_last", CASES)
def test_autotune_matches_torch(autotune_on, shape, dtype, channels_last):
    g = torch.Generator(device="cuda").manual_seed(1)
    x0 = (torch.randn(shape, device="cuda", generator=g) * 2 + 0.5).to(dtype)
    dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
    if channels_last:
        x0 = x0.to(memory_format=torch.channels_last_3d)
        dy = dy.to(memory_format=torch.channels_last_3d)
    c = shape[1]
    w0 = torch.rand(c, device="cuda") + 0.5
    b0 = torch.randn(c, device="cuda")
    before = normjit.cache_info()
    for _ in range(2):  # the first call tunes (or loads a stored choice); the second reuses it
        x, w, b = (t.detach().clone().requires_grad_() for t in (x0, w0, b0))
        y = NF.instance_norm(x, weight=w, bias=b)
        y.backward(dy)
        # .float() of a float32 tensor is the tensor itself: copy, so x0 never requires grad.
        xr = x0.detach().float().clone().requires_grad_()
        wr, br = w0.detach().clone().requires_grad_(), b0.detach().clone().requires_grad_()
        yr = F.instance_norm(xr, weight=wr, bias=br)
        yr.backward(dy.float())
        tol = TOL[dtype]
        torch.testing.assert_close(y.float(), yr, **tol)
        torch.testing.assert_close(x.grad.float(), xr.grad, **tol)
        n = x0.numel() // c
        torch.testing.assert_close(w.grad, wr.grad, rtol=tol["rtol"], atol=tol["atol"] * n ** 0.5)
        torch.testing.assert_close(b.grad, br.grad, rtol=tol["rtol"], atol=tol["atol"] * n ** 0.5)
    after = normjit.cache_info()
    tuned = (after["autotune_searches"] + after["autotune_records_loaded"]
             - before["autotune_searches"] - before["autotune_records_loaded"])
    assert 1 <= tuned <= 2, (before, after)  # forward and backward, once each at most


def test_cuda_graph_capture_with_autotune():
    """Capture after enabling autotune: nothing is timed during capture, replay is correct, and
    the first call outside capture tunes (or loads the stored choice)."""
    before = normjit.autotune_enabled()
    try:
        normjit.autotune(False)
        m = normjit.nn.InstanceNorm3d(8, affine=True).cuda()
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_()
        x = torch.randn(2, 8, 16, 16, 16, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):  # warm-up without autotune: the default kernel is loaded
                m(x)
        torch.cuda.current_stream().wait_stream(s)
        normjit.autotune(True)  # drops the plans: the capture below misses L1
        info0 = normjit.cache_info()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g), torch.no_grad():
            y = m(x)
        assert normjit.cache_info()["autotune_searches"] == info0["autotune_searches"]
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ref = F.instance_norm(x, weight=m.weight, bias=m.bias)
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(m(x), ref, rtol=1e-4, atol=1e-4)  # outside capture: tuned
        info1 = normjit.cache_info()
        assert (info1["autotune_searches"] + info1["autotune_records_loaded"]
                > info0["autotune_searches"] + info0["autotune_records_loaded"])
    finally:
        normjit.autotune(before)


# One training step of a normjit module against torch's, with running statistics; prints the
# largest differences and the autotune counters.
_SCRIPT = r'''
import json, torch, normjit
nn = torch.nn
assert normjit.autotune_enabled(), "NORMJIT_AUTOTUNE=1 must turn autotune on"
out = []
for shape, dtype, cl in [((2, 4, 32, 32, 32), torch.float32, False),
                         ((2, 32, 16, 16, 16), torch.float16, True)]:
    torch.manual_seed(0)
    c = shape[1]
    t = nn.InstanceNorm3d(c, affine=True, track_running_stats=True).cuda()
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5)
        t.bias.normal_()
        t.running_mean.normal_()
        t.running_var.uniform_(0.5, 2.0)
    m = normjit.nn.InstanceNorm3d(c, affine=True, track_running_stats=True).cuda()
    m.load_state_dict(t.state_dict())
    x = torch.randn(shape, device="cuda") * 2 + 3
    dy = torch.randn(shape, device="cuda")
    if cl:
        x = x.to(memory_format=torch.channels_last_3d)
        dy = dy.to(memory_format=torch.channels_last_3d)
    x, dy = x.to(dtype), dy.to(dtype)
    xm, xt = x.clone().requires_grad_(), x.float().requires_grad_()
    ym = m(xm)
    ym.backward(dy)
    yt = t(xt)
    yt.backward(dy.float())
    d = lambda a, b: (a.float() - b.float()).abs().max().item()
    out.append(dict(y=d(ym, yt), dx=d(xm.grad, xt.grad), dw=d(m.weight.grad, t.weight.grad),
                    rm=d(m.running_mean, t.running_mean), rv=d(m.running_var, t.running_var),
                    half=dtype != torch.float32))
torch.cuda.synchronize()
info = normjit.cache_info()
print("RESULT " + json.dumps(dict(cases=out, searches=info["autotune_searches"],
                                  loaded=info["autotune_records_loaded"])))
'''


def _step_subprocess(cache_dir):
    env = dict(os.environ, NORMJIT_CACHE_DIR=str(cache_dir), NORMJIT_AUTOTUNE="1")
    env.pop("NORMJIT_DISABLE_DISK_CACHE", None)
    p = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"subprocess failed:\n{p.stdout}\n{p.stderr}"
    r = json.loads(lines[-1][len("RESULT "):])
    for c in r["cases"]:
        tol = 2e-2 if c["half"] else 2e-4
        assert c["y"] < tol and c["dx"] < tol, c
        assert c["dw"] < tol * 50, c
        # Updated exactly once: twice would be off by momentum * (batch stat - running) ~ 0.1 or more.
        assert c["rm"] < 1e-4 and c["rv"] < 1e-3, c
    return r


def test_next_process_loads_the_choices_instead_of_searching(tmp_path):
    first = _step_subprocess(tmp_path)
    assert first["searches"] >= 2 and first["loaded"] == 0, first  # a fresh cache: searched
    second = _step_subprocess(tmp_path)
    assert second["searches"] == 0 and second["loaded"] == first["searches"], second
