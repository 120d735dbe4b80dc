"""The ONNX round trip the export tests share: kiln.export(..., file_format="ONNX") of a Cell,
onnx.checker's full check, and ONNX Runtime's outputs for the same NumPy inputs. Callers skip
first when onnx or onnxruntime is missing (pytest.importorskip)."""
import warnings

import kiln


class FnCell(kiln.nn.Cell):
    """A Cell whose construct is fn of one input, named x (to export a plain function)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x):
        return self.fn(x)


def export_checked(net, arrays, path, **options):
    """net exported to path with arrays as its example inputs (export warnings silenced), passed
    through onnx.checker.check_model(full_check=True); returns the model."""
    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = kiln.export(net, *(kiln.Tensor(a) for a in arrays), file_name=path, file_format="ONNX", **options)
    onnx.checker.check_model(model, full_check=True)
    return model


def run(path, arrays):
    """ONNX Runtime's outputs (a list) of the model at path for arrays, its inputs in order."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})
