"""cleave.frontends: PyTorch programs into the IR.

`capture(fn, *inputs, dynamic=...)` traces with torch.export and maps aten ops to IR
ops (`aten_map` holds the table). `is_supported(fx_node)` and `Translator` let the
runtime split an FX graph into regions cleave compiles and regions left to torch.
"""
from .aten_map import is_supported, supported_ops
from .capture import capture
from .errors import CaptureError, UnsupportedOpError
from .translate import Translator

__all__ = ["CaptureError", "Translator", "UnsupportedOpError", "capture", "is_supported", "supported_ops"]
