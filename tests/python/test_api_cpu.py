"""API tests that need no GPU: import, availability, modules, state_dict, fallback, convert."""
import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

import normjit  # noqa: E402
import normjit.functional as NF  # noqa: E402
from reference import instance_norm_reference, torch_unfused  # noqa: E402

nn = torch.nn


@pytest.fixture(autouse=True)
def _fresh_warnings():
    NF._warned.clear()
    yield


def test_import_and_version():
    assert isinstance(normjit.__version__, str) and normjit.__version__
    assert callable(normjit.convert)
    assert hasattr(normjit.functional, "instance_norm")


def test_is_available_returns_bool_and_reason():
    ok = normjit.is_available()
    assert isinstance(ok, bool)
    reason = normjit.unavailable_reason()
    assert isinstance(reason, str)
    if not ok:
        assert reason, "an unavailable normjit must say why"
    info = normjit.cache_info()
    assert isinstance(info, dict)
    assert info["available"] is ok
    if normjit._ops._C is not None:
        for key in ("plan_hits", "plan_misses", "kernel_hits", "kernel_misses", "disk_hits",
                    "disk_misses", "disk_writes", "disk_errors", "compiles", "compile_ms_total",
                    "compile_ms", "autotune_searches", "autotune_records_loaded", "layout_copies"):
            assert key in info, key
        normjit.reset_cache_stats()
        assert normjit.cache_info()["layout_copies"] == 0
        assert isinstance(normjit.core_version(), str)


def test_autotune_switch():
    before = normjit.autotune_enabled()
    try:
        normjit.autotune()
        assert normjit.autotune_enabled() is (normjit._ops._C is not None)
        normjit.autotune(False)
        assert normjit.autotune_enabled() is False
    finally:
        normjit.autotune(before)


def test_ops_registered_when_binding_built():
    if normjit._ops._C is None:
        pytest.skip(f"normjit._C not built: {normjit._ops._import_error}")
    assert hasattr(torch.ops.normjit, "instance_norm_fwd")
    assert hasattr(torch.ops.normjit, "instance_norm_bwd")


def test_training_backward_dispatches_only_the_normjit_op():
    """A training backward runs normjit's backward op and nothing else: autograd must not zero-fill
    gradients for the non-differentiable saved statistics (set_materialize_grads(false) in
    python/csrc/autograd.cpp), which cost every GPU backward two fill kernels until session 34.
    Meta tensors run the ops' fake kernels, so this needs no GPU."""
    if normjit._ops._C is None:
        pytest.skip(f"normjit._C not built: {normjit._ops._import_error}")
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpLog(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.empty(2, 4, 3, 3, 3, device="meta", requires_grad=True)
    w = torch.empty(4, device="meta", requires_grad=True)
    b = torch.empty(4, device="meta", requires_grad=True)
    y = normjit._ops.fwd(x, w, b, None, None, None, True, 0.1, 1e-5, 0, 0.01)[0]
    dy = torch.empty_like(y)
    with OpLog() as log:
        y.backward(dy)
    # detach: autograd storing the leaves' gradients
    assert [op for op in log.ops if op != "aten.detach.default"] == ["normjit.instance_norm_bwd.default"]
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape


@pytest.mark.parametrize("cls_name", ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"])
def test_modules_construct_like_torch(cls_name):
    ours = getattr(normjit.nn, cls_name)
    theirs = getattr(nn, cls_name)
    m = ours(8, 1e-3, 0.2, True, True)
    t = theirs(8, 1e-3, 0.2, True, True)
    assert isinstance(m, theirs)
    assert (m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats) == \
        (t.num_features, t.eps, t.momentum, t.affine, t.track_running_stats)
    m = ours(4, eps=1e-5, momentum=None, affine=False, track_running_stats=False,
             dtype=torch.float32, activation="leaky_relu", negative_slope=0.2)
    assert m.activation == "leaky_relu" and m.negative_slope == 0.2
    assert "leaky_relu" in repr(m)
    with pytest.raises(ValueError, match="unknown activation"):
        ours(4, activation="swish")


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("track", [False, True])
def test_state_dict_keys_match_torch(affine, track):
    m = normjit.nn.InstanceNorm3d(6, affine=affine, track_running_stats=track, activation="relu")
    t = nn.InstanceNorm3d(6, affine=affine, track_running_stats=track)
    assert list(m.state_dict().keys()) == list(t.state_dict().keys())
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in t.named_buffers()]


def test_state_dict_round_trip():
    t = nn.InstanceNorm3d(5, affine=True, track_running_stats=True)
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5)
        t.bias.uniform_(-1, 1)
        t.running_mean.uniform_(-1, 1)
        t.running_var.uniform_(0.5, 2)
        t.num_batches_tracked.fill_(7)
    m = normjit.nn.InstanceNorm3d(5, affine=True, track_running_stats=True)
    m.load_state_dict(t.state_dict())
    for k, v in t.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
    t2 = nn.InstanceNorm3d(5, affine=True, track_running_stats=True)
    t2.load_state_dict(m.state_dict())
    for k, v in m.state_dict().items():
        assert torch.equal(t2.state_dict()[k], v), k


@pytest.mark.parametrize("cls_name,shape", [("InstanceNorm1d", (2, 3, 17)),
                                            ("InstanceNorm2d", (2, 3, 5, 7)),
                                            ("InstanceNorm3d", (2, 3, 4, 5, 6))])
@pytest.mark.parametrize("track", [False, True])
def test_cpu_fallback_matches_torch_exactly(cls_name, shape, track):
    torch.manual_seed(0)
    m = getattr(normjit.nn, cls_name)(3, affine=True, track_running_stats=track)
    t = getattr(nn, cls_name)(3, affine=True, track_running_stats=track)
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5)
        t.bias.uniform_(-1, 1)
    m.load_state_dict(t.state_dict())
    x = torch.randn(shape)
    with pytest.warns(UserWarning, match="falling back"):
        y = m(x)
    assert torch.equal(y, t(x))
    if track:
        assert torch.equal(m.running_mean, t.running_mean)
        assert torch.equal(m.running_var, t.running_var)
        assert torch.equal(m.num_batches_tracked, t.num_batches_tracked)
    m.eval()
    t.eval()
    assert torch.equal(m(x), t(x))
    # unbatched input, as torch accepts it
    assert torch.equal(m(x[0]), t(x[0]))


def test_fallback_warns_once_per_reason():
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        NF.instance_norm(x)
        NF.instance_norm(x)
    assert sum("falling back" in str(w.message) for w in rec) == 1


@pytest.mark.parametrize("act", [None, "relu", "leaky_relu", "gelu", "gelu_tanh", "silu",
                                 "sigmoid", "tanh"])
@pytest.mark.parametrize("with_residual", [False, True])
def test_cpu_fallback_epilogue(act, with_residual):
    torch.manual_seed(1)
    x = torch.randn(2, 4, 6, 7, dtype=torch.float64)
    w = torch.rand(4, dtype=torch.float64) + 0.5
    b = torch.randn(4, dtype=torch.float64)
    r = torch.randn_like(x) if with_residual else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = NF.instance_norm(x, weight=w, bias=b, activation=act, negative_slope=0.2, residual=r)
    ref, _, _ = instance_norm_reference(x, weight=w, bias=b, activation_name=act,
                                       negative_slope=0.2, residual=r)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


def test_float64_gradcheck_through_fallback():
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.autograd.gradcheck(
            lambda x, w, b: NF.instance_norm(x, weight=w, bias=b, activation="silu"), (x, w, b))


def test_error_messages():
    with pytest.raises(ValueError, match="Expected more than 1 spatial element when training"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            NF.instance_norm(torch.randn(2, 3, 1, 1))
    with pytest.raises(ValueError, match="unknown activation"):
        NF.instance_norm(torch.randn(2, 3, 4, 4), activation="swish")
    m = normjit.nn.InstanceNorm3d(4, affine=True)
    with pytest.raises(ValueError, match="expected 4D or 5D input"):
        m(torch.randn(2, 4, 5))
    with pytest.raises(ValueError, match="to match num_features"):
        m(torch.randn(2, 3, 4, 4, 4))
    with pytest.raises(RuntimeError):  # weight of the wrong size
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            NF.instance_norm(torch.randn(2, 3, 4, 4), weight=torch.ones(4))
    with pytest.raises(RuntimeError, match="running_mean and running_var"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            NF.instance_norm(torch.randn(2, 3, 4, 4), use_input_stats=False)


def _unet_block():
    return nn.Sequential(
        nn.Conv3d(1, 4, 3, padding=1), nn.InstanceNorm3d(4, affine=True),
        nn.LeakyReLU(0.01, inplace=True),
        nn.Conv3d(4, 4, 3, padding=1), nn.InstanceNorm3d(4, affine=True),
        nn.LeakyReLU(0.01, inplace=True),
        nn.Conv3d(4, 8, 3, stride=2, padding=1), nn.InstanceNorm3d(8, affine=True), nn.ReLU(),
        nn.Conv3d(8, 8, 1), nn.InstanceNorm3d(8), nn.Conv3d(8, 2, 1))


def test_convert_replaces_and_folds():
    torch.manual_seed(0)
    model = _unet_block()
    ref = copy.deepcopy(model)
    w_before = model[1].weight
    out = normjit.convert(model, verbose=False)
    assert out is model
    norms = [m for m in model if isinstance(m, nn.InstanceNorm3d)]
    assert len(norms) == 4 and all(type(m) is normjit.nn.InstanceNorm3d for m in norms)
    assert [m.activation for m in norms] == ["leaky_relu", "leaky_relu", "relu", None]
    assert norms[0].negative_slope == 0.01
    assert isinstance(model[2], nn.Identity) and isinstance(model[8], nn.Identity)
    assert model[1].weight is w_before  # the same Parameter objects are kept
    assert len(normjit.convert.last_report) == 4
    x = torch.randn(2, 1, 8, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    # converting again changes nothing
    normjit.convert(model, verbose=False)
    assert normjit.convert.last_report == []


def test_convert_without_fusion_and_shared_activation(capsys):
    act = nn.ReLU()
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4), act, nn.Conv2d(4, 4, 3), act)
    normjit.convert(model)
    assert "replaced 1 InstanceNorm modules (0 with fused activation)" in capsys.readouterr().out
    assert model[1].activation is None and model[2] is act  # act is used twice: not folded
    model2 = nn.Sequential(nn.InstanceNorm2d(4), nn.GELU(approximate="tanh"))
    normjit.convert(model2, fuse_activations=False, verbose=False)
    assert model2[0].activation is None and isinstance(model2[1], nn.GELU)


def test_convert_nnunet_style_block():
    class ConvDropoutNormReLU(nn.Module):  # nnU-Net registers norm/nonlin twice
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(2, 4, 3, padding=1)
            self.norm = nn.InstanceNorm3d(4, affine=True)
            self.nonlin = nn.LeakyReLU(0.01, inplace=True)
            self.all_modules = nn.Sequential(self.conv, self.norm, self.nonlin)

        def forward(self, x):
            return self.all_modules(x)

    torch.manual_seed(0)
    block = ConvDropoutNormReLU()
    ref = copy.deepcopy(block)
    normjit.convert(block, verbose=False)
    assert type(block.norm) is normjit.nn.InstanceNorm3d
    assert block.norm is block.all_modules[1]
    assert block.norm.activation == "leaky_relu"
    assert isinstance(block.nonlin, nn.Identity) and isinstance(block.all_modules[2], nn.Identity)
    x = torch.randn(1, 2, 6, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(block(x), ref(x), rtol=1e-5, atol=1e-5)


def test_convert_leaves_subclasses_and_normjit_modules():
    class MyNorm(nn.InstanceNorm2d):
        pass

    model = nn.Sequential(MyNorm(3), normjit.nn.InstanceNorm2d(3), nn.ReLU())
    normjit.convert(model, verbose=False)
    assert type(model[0]) is MyNorm
    assert model[1].activation is None and isinstance(model[2], nn.ReLU)


def test_zero_size_input():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = NF.instance_norm(torch.randn(2, 3, 0, 4), weight=torch.ones(3), bias=torch.zeros(3))
    assert y.shape == (2, 3, 0, 4)


def test_momentum_none_like_torch():
    m = normjit.nn.InstanceNorm2d(3, momentum=None, track_running_stats=True)
    t = nn.InstanceNorm2d(3, momentum=None, track_running_stats=True)
    x = torch.randn(2, 3, 5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(m(x), t(x))
    torch.testing.assert_close(m.running_mean, t.running_mean)


def test_reference_matches_torch():
    x = torch.randn(3, 4, 5, 6, dtype=torch.float64)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    y, nrm, nrv = instance_norm_reference(x, rm, rv)
    rm2, rv2 = rm.clone(), rv.clone()
    yt = torch_unfused(x, rm2, rv2)
    torch.testing.assert_close(y, yt)
    torch.testing.assert_close(nrm, rm2)
    torch.testing.assert_close(nrv, rv2)
