"""A small nnU-Net-style 3D U-Net: one training step with torch's norms vs normjit.convert()."""
import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

import normjit  # noqa: E402

pytestmark = pytest.mark.cuda
nn = torch.nn


def conv_block(cin, cout, stride=1):
    return nn.Sequential(
        nn.Conv3d(cin, cout, 3, stride=stride, padding=1),
        nn.InstanceNorm3d(cout, eps=1e-5, affine=True),
        nn.LeakyReLU(0.01, inplace=True),
    )


class UNet3d(nn.Module):
    def __init__(self, cin=1, classes=3, f=8):
        super().__init__()
        self.enc0 = nn.Sequential(conv_block(cin, f), conv_block(f, f))
        self.enc1 = nn.Sequential(conv_block(f, 2 * f, stride=2), conv_block(2 * f, 2 * f))
        self.bottleneck = nn.Sequential(conv_block(2 * f, 4 * f, stride=2),
                                        conv_block(4 * f, 4 * f))
        self.up1 = nn.ConvTranspose3d(4 * f, 2 * f, 2, stride=2)
        self.dec1 = nn.Sequential(conv_block(4 * f, 2 * f), conv_block(2 * f, 2 * f))
        self.up0 = nn.ConvTranspose3d(2 * f, f, 2, stride=2)
        self.dec0 = nn.Sequential(conv_block(2 * f, f), conv_block(f, f))
        self.head = nn.Conv3d(f, classes, 1)

    def forward(self, x):
        s0 = self.enc0(x)
        s1 = self.enc1(s0)
        b = self.bottleneck(s1)
        d1 = self.dec1(torch.cat([self.up1(b), s1], 1))
        d0 = self.dec0(torch.cat([self.up0(d1), s0], 1))
        return self.head(d0)


@pytest.fixture(autouse=True)
def _setup(cuda):
    if not normjit.is_available():
        pytest.fail(f"a GPU is present but normjit is unavailable: {normjit.unavailable_reason()}")
    flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    yield
    (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = flags


def _train_step(model, x, target, autocast):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0)
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
        out = model(x)
        loss = nn.functional.cross_entropy(out.float(), target)
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_unet_training_step_matches_torch(autocast, channels_last):
    torch.manual_seed(0)
    ref = UNet3d().cuda()
    ours = normjit.convert(copy.deepcopy(ref), verbose=False)
    assert len(normjit.convert.last_report) == 10
    assert all(type(m) is not nn.LeakyReLU for m in ours.modules())
    x = torch.randn(2, 1, 32, 32, 32, device="cuda")
    target = torch.randint(0, 3, (2, 32, 32, 32), device="cuda")
    if channels_last:
        x = x.to(memory_format=torch.channels_last_3d)
        ref = ref.to(memory_format=torch.channels_last_3d)
        ours = ours.to(memory_format=torch.channels_last_3d)
    loss_ref = _train_step(ref, x, target, autocast)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="normjit: falling back")
        loss_ours = _train_step(ours, x, target, autocast)
    tol = dict(rtol=2e-2, atol=2e-3) if autocast else dict(rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(loss_ours, loss_ref, **tol)
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p, ref_params[name], **tol, msg=f"parameter {name}")
