"""A real NNAPI client: PyTorch's NNAPI backend (torch.backends._nnapi) through our library,
loaded first by path as PyTorch's own tests do (LIBNEURALNETWORKS_PATH, ctypes) so its binding
finds it by SONAME. Float and quint8 models against torch's eager results. Skipped without
torch (it is not in the test extra: the CPU wheel is 191 MB)."""

import ctypes

import pytest

from nnhal.capi.build import NAME

torch = pytest.importorskip("torch")
nnapi_prepare = pytest.importorskip("torch.backends._nnapi.prepare")
#: torch.ao.quantization and quint8 tensor creation are deprecated in torch 2.13: still there.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


@pytest.fixture(scope="module", autouse=True)
def library(libdir):
    ctypes.CDLL(str(libdir / NAME))
    torch.manual_seed(0)
    torch.backends.quantized.engine = "qnnpack"


def _through_nnapi(model, inputs, template=None):
    with torch.no_grad():
        traced = torch.jit.trace(model, tuple(inputs))
        nn = nnapi_prepare.convert_model_to_nnapi(traced, template or inputs)
        return model(*inputs), nn(*inputs)


def _quantize(model, example):
    model.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    model = torch.ao.quantization.prepare(model)
    model(example)
    return torch.ao.quantization.convert(model)


def _q(t, scale=0.05, zp=128):
    return torch.quantize_per_tensor(t, scale, zp, torch.quint8)


def test_float_model():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 5)).eval()
    ref, out = _through_nnapi(model, [torch.randn(1, 3, 16, 16)])
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, atol=1e-5)


def test_float_nhwc_model():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Hardtanh(0.0, 6.0)).eval()
    x = torch.randn(1, 3, 12, 12).contiguous(memory_format=torch.channels_last)
    x.nnapi_nhwc = True
    ref, out = _through_nnapi(model, [x])
    assert torch.allclose(out, ref, atol=1e-5)


def test_flexible_batch_reads_output_dimensions():
    """A zero-sized dimension in the template makes the output shape come from
    getOutputOperandRank/Dimensions after the run."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.ReLU()).eval()
    x = torch.randn(4, 6)
    ref, out = _through_nnapi(model, [x], template=[torch.zeros(0, 6)])
    assert out.shape == (4, 3)
    assert torch.allclose(out, ref, atol=1e-5)


def test_quint8_models():
    func = torch.ao.nn.quantized.QFunctional()
    func.scale, func.zero_point = 0.5, 120

    class Add(torch.nn.Module):
        def forward(self, a, b):
            return func.add(a, b)

    ref, out = _through_nnapi(Add().eval(), [_q(torch.tensor([[1.0, 2.0]]), 0.25),
                                             _q(torch.tensor([[3.0, 4.0]]), 0.25)])
    assert torch.equal(out.int_repr(), ref.int_repr())
    conv = _quantize(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval(),
                     torch.randn(1, 3, 10, 10))
    ref, out = _through_nnapi(conv, [_q(torch.randn(1, 3, 10, 10))])
    assert (out.int_repr().int() - ref.int_repr().int()).abs().max() <= 1
    linear = _quantize(torch.nn.Sequential(torch.nn.Linear(16, 4)).eval(), torch.randn(2, 16))
    ref, out = _through_nnapi(linear, [_q(torch.randn(2, 16))])
    assert (out.int_repr().int() - ref.int_repr().int()).abs().max() <= 1
