"""normjit on the GPU: values, gradients, running stats, layouts, epilogues, compile, graphs."""
import contextlib
import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")

import normjit  # noqa: E402
import normjit.functional as NF  # noqa: E402
from reference import ACTIVATIONS, instance_norm_reference, torch_unfused  # noqa: E402

pytestmark = pytest.mark.cuda
nn = torch.nn
F = torch.nn.functional

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4),
       torch.float16: dict(rtol=1e-2, atol=1e-2),
       torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


@pytest.fixture(autouse=True)
def _require_normjit(cuda):
    if not normjit.is_available():
        pytest.fail(f"a GPU is present but normjit is unavailable: {normjit.unavailable_reason()}")
    # torch's fp32 references must not use TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield


@contextlib.contextmanager
def _no_fallback():
    """Context: any fallback warning is an error (the GPU path must be taken)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="normjit: falling back")
        yield


def _make(shape, dtype, channels_last=False, offset=0.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", dtype=torch.float32, generator=g) + offset
    x = x.to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last_3d if x.dim() == 5 else torch.channels_last)
    return x


SHAPES = [(2, 4, 8, 8, 8), (3, 5, 7, 11, 13), (1, 3, 5, 7, 11), (2, 1, 6, 5, 4),
          (2, 6, 33, 1, 17), (4, 6, 100), (4, 6, 20, 30), (2, 3, 64, 64, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("affine", [False, True])
def test_forward_training_values(shape, dtype, channels_last, affine):
    if channels_last and len(shape) == 3:
        pytest.skip("no channels-last format for 3-d tensors")
    x = _make(shape, dtype, channels_last)
    c = shape[1]
    w = torch.rand(c, device="cuda") + 0.5 if affine else None
    b = torch.randn(c, device="cuda") if affine else None
    with _no_fallback():
        y = NF.instance_norm(x, weight=w, bias=b)
    assert y.dtype == dtype and y.shape == x.shape
    if channels_last:
        fmt = torch.channels_last_3d if x.dim() == 5 else torch.channels_last
        assert y.is_contiguous(memory_format=fmt)
    ref64, _, _ = instance_norm_reference(x, weight=w, bias=b)
    torch.testing.assert_close(y.double().cpu(), ref64, **TOL[dtype])
    if dtype != torch.float32:  # also against torch's fp32 computation of the same input
        reft = F.instance_norm(x.float(), weight=w, bias=b)
        torch.testing.assert_close(y.float(), reft, **TOL[dtype])


@pytest.mark.parametrize("affine,track", list(itertools.product([False, True], [False, True])))
@pytest.mark.parametrize("channels_last", [False, True])
def test_module_train_eval_like_torch(affine, track, channels_last):
    torch.manual_seed(0)
    t = nn.InstanceNorm3d(6, affine=affine, track_running_stats=track).cuda()
    if affine:
        with torch.no_grad():
            t.weight.uniform_(0.5, 1.5)
            t.bias.uniform_(-1, 1)
    m = normjit.nn.InstanceNorm3d(6, affine=affine, track_running_stats=track).cuda()
    m.load_state_dict(t.state_dict())
    with _no_fallback():
        for step in range(3):
            x = _make((2, 6, 9, 10, 11), torch.float32, channels_last, offset=step, seed=step)
            torch.testing.assert_close(m(x), t(x), rtol=1e-4, atol=1e-4)
        if track:
            torch.testing.assert_close(m.running_mean, t.running_mean, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(m.running_var, t.running_var, rtol=1e-5, atol=1e-6)
            assert torch.equal(m.num_batches_tracked, t.num_batches_tracked)
        m.eval()
        t.eval()
        x = _make((2, 6, 9, 10, 11), torch.float32, channels_last, seed=9)
        torch.testing.assert_close(m(x), t(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m(x[0]), t(x[0]), rtol=1e-4, atol=1e-4)  # unbatched


def test_running_stats_vs_reference():
    x = _make((3, 4, 6, 7, 8), torch.float32)
    rm = torch.randn(4, device="cuda")
    rv = torch.rand(4, device="cuda") + 0.5
    _, erm, erv = instance_norm_reference(x, rm, rv, momentum=0.3)
    with _no_fallback():
        NF.instance_norm(x, rm, rv, momentum=0.3)
    torch.testing.assert_close(rm.double().cpu(), erm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rv.double().cpu(), erv, rtol=1e-5, atol=1e-6)


def test_half_running_stats_buffers():
    t = nn.InstanceNorm3d(4, track_running_stats=True).cuda().half()
    m = normjit.nn.InstanceNorm3d(4, track_running_stats=True).cuda().half()
    x = _make((2, 4, 8, 8, 8), torch.float16)
    with _no_fallback():
        torch.testing.assert_close(m(x), t(x), rtol=1e-2, atol=1e-2)
    assert m.running_mean.dtype == torch.float16
    torch.testing.assert_close(m.running_var, t.running_var, rtol=1e-3, atol=1e-3)


def test_mean_much_larger_than_std():
    x = _make((2, 3, 16, 16, 16), torch.float32, offset=1000.0)
    with _no_fallback():
        y = NF.instance_norm(x)
    ref, _, _ = instance_norm_reference(x)
    torch.testing.assert_close(y.double().cpu(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nan_propagates_to_its_instance_only(dtype):
    x = _make((2, 3, 8, 8, 8), dtype)
    x[0, 1, 3, 3, 3] = float("nan")
    with _no_fallback():
        y = NF.instance_norm(x)
    assert torch.isnan(y[0, 1]).all()
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask[0, 1] = False
    assert torch.isfinite(y.float().reshape(6, -1)[mask.reshape(-1).cuda()]).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [(2, 32, 128, 128, 128), (2, 64, 64, 64, 64), (2, 30, 48, 48, 48)])
def test_nan_and_inf_in_split_kernels_stay_in_their_instance(shape, channels_last, bad):
    # The split kernels (resident, streamed, channels-last and its flat super-rows) merge partials
    # across CTAs: a NaN or an infinity in one instance must give NaN there, as torch does, and
    # leave every other instance (same CTA tile, same sample) exact, forward and backward.
    x = _make(shape, torch.float16, channels_last=channels_last).requires_grad_()
    with torch.no_grad():
        x[0, 1, 5, 7, 9] = bad
    dy = _make(shape, torch.float16, channels_last=channels_last, seed=1)
    with _no_fallback():
        y = NF.instance_norm(x)
        (dx,) = torch.autograd.grad(y, x, dy)
    yt = F.instance_norm(x.detach().float().requires_grad_())
    assert torch.isnan(yt[0, 1]).all()  # torch: inf - inf in the mean or the variance
    assert torch.isnan(y[0, 1]).all() and torch.isnan(dx[0, 1]).all()
    for n, c in [(0, 0), (0, 2), (1, 1)]:
        xr = x[n:n + 1, c:c + 1].detach().double().requires_grad_()
        yr = F.instance_norm(xr)
        (dxr,) = torch.autograd.grad(yr, xr, dy[n:n + 1, c:c + 1].double())
        torch.testing.assert_close(y[n:n + 1, c:c + 1].double(), yr, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(dx[n:n + 1, c:c + 1].double(), dxr, rtol=1e-2, atol=2e-2)


@pytest.fixture(params=["auto", "l2", "resident"])
def split_mode(request, monkeypatch):
    """NORMJIT_SPLIT for one test: "auto" (the default: the training forward keeps a chunk in
    shared memory where the tensor fits on chip and the exchange is the scattered merge), "l2"
    (streamed twice) or "resident" (kept wherever it fits). Plans made before or after keep their
    own choice: the in-memory caches are cleared on both ends."""
    if request.param == "auto":
        monkeypatch.delenv("NORMJIT_SPLIT", raising=False)
    else:
        monkeypatch.setenv("NORMJIT_SPLIT", request.param)
    normjit.clear_memory_caches()
    yield request.param
    monkeypatch.undo()
    normjit.clear_memory_caches()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(2, 256, 16, 16, 16), (2, 128, 32, 32, 32), (1, 96, 24, 40, 40),
                                   (3, 40, 32, 32, 30), (2, 20, 40, 40, 40)])
def test_channels_last_split_merges_vs_float64(shape, dtype, split_mode):
    # The channels-last split merges its chunks' per-channel pairs in one of two ways
    # (kernels/nhwc_exchange.cuh): every CTA reads every chunk's pairs where there are fewer chunks
    # than columns ((2,256,16^3): 16 chunks), else the scattered merge (CTA k merges column k and
    # publishes it): the others, with a partly filled channel tile for C = 96 and C = 40 and flat
    # super-rows for C = 20 in fp16. With split_mode "auto" or "resident" the fp16 forwards of
    # (2,256,16^3) and (2,128,32^3) keep their chunks in shared memory (kernels/nhwc_ring.cuh), with
    # "l2" every split streams twice; the backwards always stream. Mean >> std, running statistics
    # and weight gradients against float64.
    c = shape[1]
    x0 = _make(shape, dtype, channels_last=True, offset=100.0)
    dy = _make(shape, dtype, channels_last=True, seed=3)
    w0 = torch.rand(c, device="cuda") + 0.5
    b0 = torch.randn(c, device="cuda")
    rm, rv = torch.randn(c, device="cuda"), torch.rand(c, device="cuda") + 0.5
    _, erm, erv = instance_norm_reference(x0, rm, rv, momentum=0.2)
    x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
    with _no_fallback():
        y = NF.instance_norm(x, rm, rv, weight=w, bias=b, momentum=0.2)
    y.backward(dy)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x0, w0, b0))
    yr = F.instance_norm(xr, weight=wr, bias=br)
    yr.backward(dy.double())
    tol = TOL[dtype]
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(y.double(), yr, **tol)
    torch.testing.assert_close(x.grad.double(), xr.grad, **tol)
    # dweight = sum dy * (x - mean) * rstd: the fp32 mean of values near 100 is rounded by up to
    # 3.8e-6 (half an ulp), which shifts dweight by that times |sum dy| (~300 here): ~1e-3.
    torch.testing.assert_close(w.grad.double(), wr.grad, rtol=max(tol["rtol"], 1e-3), atol=max(tol["atol"] * 10, 1e-2))
    torch.testing.assert_close(b.grad.double(), br.grad, rtol=tol["rtol"], atol=tol["atol"] * 10)
    torch.testing.assert_close(rm.double().cpu(), erm, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(rv.double().cpu(), erv, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 8, 9, 10), (1, 3, 5, 7, 11), (3, 5, 40), (2, 3, 17, 19), (2, 30, 12, 16, 16)])
def test_gradients_vs_torch(dtype, channels_last, shape):
    if channels_last and len(shape) == 3:
        pytest.skip("no channels-last format for 3-d tensors")
    c = shape[1]
    x0 = _make(shape, dtype, channels_last)
    w0 = torch.rand(c, device="cuda") + 0.5
    b0 = torch.randn(c, device="cuda")
    dy = _make(shape, dtype, channels_last, seed=5)
    x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
    with _no_fallback():
        y = NF.instance_norm(x, weight=w, bias=b)
    y.backward(dy)
    # reference: torch in fp32 on the same (rounded) input
    xr, wr, br = x0.float().requires_grad_(), w0.clone().requires_grad_(), b0.clone().requires_grad_()
    F.instance_norm(xr, weight=wr, bias=br).backward(dy.float())
    tol = TOL[dtype]
    torch.testing.assert_close(x.grad.float(), xr.grad, **tol)
    torch.testing.assert_close(w.grad, wr.grad, rtol=tol["rtol"], atol=tol["atol"] * 10)
    torch.testing.assert_close(b.grad, br.grad, rtol=tol["rtol"], atol=tol["atol"] * 10)
    assert x.grad.dtype == dtype


def test_gradients_partial_needs():
    x = _make((2, 3, 8, 8, 8), torch.float32)
    w = (torch.rand(3, device="cuda") + 0.5).requires_grad_()
    b = torch.zeros(3, device="cuda", requires_grad=True)
    with _no_fallback():
        y = NF.instance_norm(x, weight=w, bias=b)
    (gw,) = torch.autograd.grad((y * y).sum(), [w])
    (gw_ref,) = torch.autograd.grad((F.instance_norm(x, weight=w, bias=b) ** 2).sum(), [w])
    torch.testing.assert_close(gw, gw_ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("train", [True, False])
def test_epilogue_values_and_grads(act, with_residual, train):
    shape = (2, 4, 6, 7, 8)
    x0 = _make(shape, torch.float32)
    r0 = _make(shape, torch.float32, seed=3) if with_residual else None
    w0 = torch.rand(4, device="cuda") + 0.5
    b0 = torch.randn(4, device="cuda")
    rm, rv = torch.randn(4, device="cuda"), torch.rand(4, device="cuda") + 0.5
    dy = _make(shape, torch.float32, seed=4)

    def run(fn, rm, rv):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        r = r0.clone().requires_grad_() if r0 is not None else None
        y = fn(x, rm, rv, w, b, train, 0.1, 1e-5, act, 0.2, r)
        ins = [x, w, b] + ([r] if r is not None else [])
        return (y,) + torch.autograd.grad(y, ins, dy)

    def ours(x, rm, rv, w, b, train, mom, eps, act, slope, r):
        return NF.instance_norm(x, rm, rv, w, b, train, mom, eps, activation=act,
                                negative_slope=slope, residual=r)

    def theirs(x, rm, rv, w, b, train, mom, eps, act, slope, r):
        return torch_unfused(x, rm, rv, w, b, train, mom, eps, activation_name=act,
                             negative_slope=slope, residual=r)

    rm1, rv1, rm2, rv2 = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    with _no_fallback():
        got = run(ours, rm1, rv1)
    want = run(theirs, rm2, rv2)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(rm1, rm2)
    torch.testing.assert_close(rv1, rv2)


def test_backward_is_deterministic():
    x0 = _make((2, 8, 32, 32, 32), torch.float16)
    w0 = torch.rand(8, device="cuda") + 0.5
    b0 = torch.randn(8, device="cuda")
    dy = _make(x0.shape, torch.float16, seed=7)
    grads = []
    for _ in range(2):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        with _no_fallback():
            NF.instance_norm(x, weight=w, bias=b, activation="leaky_relu").backward(dy)
        grads.append((x.grad, w.grad, b.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("channels_last", [False, True])
def test_training_backward_launches_normjit_kernels_only(channels_last):
    """A training backward is normjit's kernel alone: autograd must not zero-fill gradients for the
    non-differentiable saved statistics (set_materialize_grads(false), python/csrc/autograd.cpp),
    which cost two fill kernels and their launches a backward until session 34."""
    x = _make((2, 16, 8, 8, 8), torch.float16, channels_last).requires_grad_()
    w = (torch.rand(16, device="cuda") + 0.5).requires_grad_()
    b = torch.randn(16, device="cuda", requires_grad=True)
    dy = _make(x.shape, torch.float16, channels_last, seed=3)
    with _no_fallback():
        NF.instance_norm(x, weight=w, bias=b).backward(dy)  # compiles and warms up
        x.grad = w.grad = b.grad = None
        y = NF.instance_norm(x, weight=w, bias=b)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y.backward(dy)
            torch.cuda.synchronize()
    gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any(name.startswith("normjit_") for name in gpu), gpu
    assert [name for name in gpu if not name.startswith("normjit_")] == [], gpu
    assert x.grad is not None and w.grad is not None and b.grad is not None


def test_non_dense_input_is_copied_and_counted():
    normjit.reset_cache_stats()
    base = _make((2, 3, 10, 12, 14), torch.float32)
    x = base.transpose(2, 4)  # neither contiguous nor channels-last
    with _no_fallback():
        y = NF.instance_norm(x)
    torch.testing.assert_close(y, F.instance_norm(x), rtol=1e-4, atol=1e-4)
    assert normjit.cache_info()["layout_copies"] >= 1


def test_residual_with_other_layout():
    x = _make((2, 3, 8, 8, 8), torch.float32, channels_last=True)
    r = _make((2, 3, 8, 8, 8), torch.float32, seed=2)  # NCDHW while x is channels_last_3d
    with _no_fallback():
        y = NF.instance_norm(x, residual=r, activation="relu")
    torch.testing.assert_close(y, F.relu(F.instance_norm(x) + r), rtol=1e-4, atol=1e-4)


def test_fallback_for_float64_cuda_and_gradcheck():
    NF._warned.clear()
    x = torch.randn(2, 3, 4, 5, device="cuda", dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, device="cuda", dtype=torch.float64, requires_grad=True)
    with pytest.warns(UserWarning, match="float64"):
        y = NF.instance_norm(x, weight=w)
    torch.testing.assert_close(y, F.instance_norm(x, weight=w))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.autograd.gradcheck(lambda x, w: NF.instance_norm(x, weight=w), (x, w))


def test_zero_size_gpu():
    x = torch.randn(0, 3, 4, 4, 4, device="cuda", requires_grad=True)
    with _no_fallback():
        y = NF.instance_norm(x, weight=torch.ones(3, device="cuda"))
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_single_spatial_element_error():
    with pytest.raises(ValueError, match="Expected more than 1 spatial element when training"):
        NF.instance_norm(torch.randn(2, 3, 1, 1, 1, device="cuda"))


def test_op_errors_are_runtime_errors():
    x = torch.randn(2, 3, 4, 4, device="cuda")
    with pytest.raises(RuntimeError, match="3"):
        NF.instance_norm(x, weight=torch.ones(4, device="cuda"))
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.ops.normjit.instance_norm_fwd(x.cpu(), None, None, None, None, None, True, 0.1,
                                            1e-5, 0, 0.0)


@pytest.mark.parametrize("train", [True, False])
def test_opcheck(train):
    x = torch.randn(2, 3, 4, 5, 6, device="cuda", requires_grad=True)
    w = torch.rand(3, device="cuda", requires_grad=True)
    b = torch.randn(3, device="cuda", requires_grad=True)
    r = torch.randn(2, 3, 4, 5, 6, device="cuda", requires_grad=True)
    rm, rv = torch.zeros(3, device="cuda"), torch.ones(3, device="cuda")
    torch.library.opcheck(torch.ops.normjit.instance_norm_fwd.default,
                          (x, w, b, r, rm, rv, train, 0.1, 1e-5, 2, 0.1))
    xc = x.detach().to(memory_format=torch.channels_last_3d).requires_grad_()
    torch.library.opcheck(torch.ops.normjit.instance_norm_fwd.default,
                          (xc, w, b, None, rm, rv, train, 0.1, 1e-5, 0, 0.0))


def test_opcheck_bwd():
    x = torch.randn(2, 3, 4, 5, 6, device="cuda")
    w, b = torch.rand(3, device="cuda"), torch.randn(3, device="cuda")
    _, sm, sr = torch.ops.normjit.instance_norm_fwd(x, w, b, None, None, None, True, 0.1, 1e-5,
                                                    1, 0.0)
    torch.library.opcheck(torch.ops.normjit.instance_norm_bwd.default,
                          (torch.randn_like(x), x, w, b, None, sm, sr, 1, 0.0, [True, True, False]),
                          test_utils=("test_schema", "test_faketensor"))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 8, 3, padding=1)
        self.norm = normjit.nn.InstanceNorm3d(8, affine=True, activation="leaky_relu")
        self.out = nn.Conv3d(8, 2, 1)

    def forward(self, x):
        return self.out(self.norm(self.conv(x)))


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    net = _Net().cuda()
    x = torch.randn(2, 4, 12, 12, 12, device="cuda")
    with _no_fallback():
        eager = net(x)
        compiled = torch.compile(net, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    # and its backward
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    net(xe).sum().backward()
    ge = xe.grad
    torch.compile(net, fullgraph=True)(xc).sum().backward()
    torch.testing.assert_close(xc.grad, ge, rtol=1e-3, atol=1e-4)


def test_cuda_graph_capture_and_replay():
    m = normjit.nn.InstanceNorm3d(8, affine=True, activation="relu").cuda()
    x = torch.randn(2, 8, 16, 16, 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), _no_fallback():
        for _ in range(3):  # warm-up: compile and cache the kernels outside the capture
            m(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = m(x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, m(x), rtol=0, atol=0)


def test_channels_last_3d_output_preserved_in_module():
    m = normjit.nn.InstanceNorm3d(4).cuda()
    x = _make((2, 4, 8, 8, 8), torch.float16, channels_last=True)
    with _no_fallback():
        y = m(x)
    assert y.is_contiguous(memory_format=torch.channels_last_3d)


@pytest.mark.huge
@pytest.mark.parametrize("shape", [(1, 1, 1291, 1291, 1291), (2, 1, 1024, 1024, 1025)])
def test_more_than_2_pow_31_elements_fp16(shape):
    numel = 1
    for s in shape:
        numel *= s
    assert numel > 2 ** 31
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * numel * 2:
        pytest.skip(f"needs {3 * numel * 2 / 2**30:.1f} GiB of free GPU memory")
    torch.manual_seed(0)
    x = torch.empty(shape, device="cuda", dtype=torch.float16)
    x.normal_(3.0, 2.0)
    with _no_fallback():
        y = NF.instance_norm(x)
    n, c, d = shape[:3]
    for i in range(n):
        for j in range(c):
            # reference statistics in chunks, in float64
            s1 = torch.zeros((), device="cuda", dtype=torch.float64)
            for k in range(0, d, 64):
                s1 += x[i, j, k:k + 64].double().sum()
            count = x[i, j].numel()
            mean = s1 / count
            s2 = torch.zeros((), device="cuda", dtype=torch.float64)
            for k in range(0, d, 64):
                s2 += ((x[i, j, k:k + 64].double() - mean) ** 2).sum()
            rstd = torch.rsqrt(s2 / count + 1e-5)
            for k in (0, d // 2, d - 1):  # first, middle and last slices
                ref = ((x[i, j, k].double() - mean) * rstd).float()
                torch.testing.assert_close(y[i, j, k].float(), ref, rtol=1e-2, atol=1e-2)
            ym = y[i, j, d - 8:].float()
            assert torch.isfinite(ym).all()
    del x, y
    torch.cuda.empty_cache()


@pytest.mark.huge
def test_resident_split_past_2_pow_31_elements_fp16():
    # Many instances of the resident split (the training forward's default for 128^3 volumes) with
    # element offsets past 2^31: 64-bit indexing in the pipelined kernel, forward and backward.
    shape = (33, 32, 128, 128, 128)
    numel = 33 * 32 * 128 ** 3
    assert numel > 2 ** 31
    free, _ = torch.cuda.mem_get_info()
    if free < 5 * numel * 2:
        pytest.skip(f"needs {5 * numel * 2 / 2**30:.1f} GiB of free GPU memory")
    torch.manual_seed(0)
    x = torch.empty(shape, device="cuda", dtype=torch.float16).normal_(3.0, 2.0).requires_grad_()
    with _no_fallback():
        y = NF.instance_norm(x)
        dy = torch.empty_like(y).normal_()
        (dx,) = torch.autograd.grad(y, x, dy)
    for n in (0, 16, 32):  # the last sample lies entirely past 2^31 elements
        xr = x[n:n + 1].detach().double().requires_grad_()
        yr = F.instance_norm(xr)
        (dxr,) = torch.autograd.grad(yr, xr, dy[n:n + 1].double())
        torch.testing.assert_close(y[n:n + 1].float(), yr.float(), rtol=1e-2, atol=2e-2)
        torch.testing.assert_close(dx[n:n + 1].float(), dxr.float(), rtol=1e-2, atol=2e-2)
    del x, y, dy, dx
    torch.cuda.empty_cache()


@pytest.mark.huge
def test_channels_last_flat_past_2_pow_31_elements_fp16():
    # Channels-last with C = 30 (the flat super-rows of lcm(30, 8) = 120 elements) and element
    # offsets past 2^31: the second sample ends past it. Forward and backward against float64,
    # computed per channel in closed form (no affine: dx = rstd (dy - mean(dy) - xhat mean(dy xhat)))
    # so that the test needs the four fp16 tensors (17.3 GB) and one channel in float64, not a
    # float64 sample under autograd (it then needed 80 GiB and skipped on 80 GB cards).
    shape = (2, 30, 336, 336, 320)
    numel = 2 * 30 * 336 * 336 * 320
    assert numel > 2 ** 31
    free, _ = torch.cuda.mem_get_info()
    needs = 4 * numel * 2 + 4 * 2 ** 30  # x, y, dy, dx; one channel's float64 terms
    if free < needs:
        pytest.skip(f"needs {needs / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} free")
    torch.manual_seed(0)
    x = torch.empty(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last_3d)
    x.normal_(3.0, 2.0)
    x.requires_grad_()
    with _no_fallback():
        y = NF.instance_norm(x)
        dy = torch.empty_like(y).normal_()
        (dx,) = torch.autograd.grad(y, x, dy)
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    assert dx.is_contiguous(memory_format=torch.channels_last_3d)
    for c in (0, 13, 29):  # channel 29 of sample 1 holds the tensor's last element
        xc = x.detach()[1, c].double()
        dyc = dy[1, c].double()
        mean = xc.mean()
        rstd = torch.rsqrt(((xc - mean) ** 2).mean() + 1e-5)
        xhat = (xc - mean) * rstd
        dxc = rstd * (dyc - dyc.mean() - xhat * (dyc * xhat).mean())
        torch.testing.assert_close(y[1, c].float(), xhat.float(), rtol=1e-2, atol=2e-2)
        torch.testing.assert_close(dx[1, c].float(), dxc.float(), rtol=1e-2, atol=2e-2)
        del xc, dyc, xhat, dxc
    del x, y, dy, dx
    torch.cuda.empty_cache()
