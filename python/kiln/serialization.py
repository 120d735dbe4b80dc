"""Checkpoints (kiln.serialization: MindSpore's module name; kiln.checkpoint is JAX's recompute),
MindSpore's API: save_checkpoint, load_checkpoint, load_param_into_net (PyTorch's
Cell.state_dict / load_state_dict beside them), in kiln's own file format -- no pickle, nothing
executed on load, every count, size and name checked against the file before use.

The file (little-endian):
    magic    8 bytes  b"KILNCKPT"
    version  u32      1 (a later version is refused: CheckpointError)
    flags    u32      0
    length   u64      bytes of the payload that follows (the file's remaining size)
    crc32    u32      zlib.crc32 of the payload
    payload  u32 entry count, then per entry:
             u32 name length, the name (UTF-8, no NUL, unique in the file)
             u8 kind: 0 tensor, 1 int (i64), 2 float (f64), 3 bool (u8), 4 str (u32 length + UTF-8)
             a tensor: u8 dtype code, u8 ndim (<= 8), ndim u64 sizes, u64 byte count (= elements x
             item size), the elements in C order
A Cell's entries are its parameters by path ("layer.weight"); an optimizer's are its state
(its moments, step counts and global step) under "<its name>.": save_checkpoint([net, opt] or
append_dict) keeps a training run resumable exactly."""
import os
import struct
import zlib

import numpy as np

from . import _C
from ._tensor import Tensor
from .nn.cell import load_param_into_net  # (kiln.load_param_into_net: MindSpore's place for it)

MAGIC = b"KILNCKPT"
VERSION = 1
_HEADER = struct.Struct("<8sIIQI")
_DTYPES = {0: "bool", 1: "int8", 2: "int32", 3: "int64", 4: "float16", 5: "bfloat16", 6: "float32", 7: "float64"}
_CODES = {v: k for k, v in _DTYPES.items()}
_NP = {"bool": np.bool_, "int8": np.int8, "int32": np.int32, "int64": np.int64, "float16": np.float16,
       "float32": np.float32, "float64": np.float64}
_MAX_NDIM = 8
_MAX_NAME = 1 << 16


class CheckpointError(ValueError):
    """A checkpoint file kiln cannot read: names the file and what is wrong."""


# ---- writing ------------------------------------------------------------------------------

def _entries_of(save_obj, append_dict):
    """[(name, value)] in order, names unique."""
    from .nn import Cell

    out = []
    objs = save_obj if isinstance(save_obj, (list, tuple)) and not _is_entry_list(save_obj) else [save_obj]
    for obj in objs:
        if isinstance(obj, Cell):
            out += obj.checkpoint_entries()
        elif isinstance(obj, dict):
            out += list(obj.items())
        elif isinstance(obj, (list, tuple)):  # MindSpore's [{"name": ..., "data": ...}, ...]
            for item in obj:
                if not isinstance(item, dict) or "name" not in item or "data" not in item:
                    raise TypeError("save_checkpoint: a list must hold dicts with 'name' and 'data'")
                out.append((item["name"], item["data"]))
        else:
            raise TypeError(f"save_checkpoint: cannot save a {type(obj).__name__} (a Cell, an optimizer, a dict of "
                            "tensors or a list of {'name', 'data'} dicts)")
    if append_dict:
        out += list(append_dict.items())
    seen = set()
    for name, _ in out:
        if not isinstance(name, str) or not name or "\0" in name:
            raise ValueError(f"save_checkpoint: entry names must be non-empty str without NUL, got {name!r}")
        if name in seen:
            raise ValueError(f"save_checkpoint: two entries are named {name!r}")
        seen.add(name)
    return out


def _is_entry_list(obj):
    return bool(obj) and all(isinstance(x, dict) and "name" in x and "data" in x for x in obj)


def _encode(name, value):
    n = name.encode("utf-8")
    parts = [struct.pack("<I", len(n)), n]
    if isinstance(value, _C.TensorBase) or isinstance(value, np.ndarray):
        t = value if isinstance(value, _C.TensorBase) else Tensor(value)
        dt = t.dtype.name
        arr = np.ascontiguousarray(t.astype(_C.float32).asnumpy() if dt == "bfloat16" else t.asnumpy())
        if dt == "bfloat16":  # stored as its 2-byte patterns
            data = (arr.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        else:
            data = arr.tobytes()
        parts += [struct.pack("<BBB", 0, _CODES[dt], t.ndim), struct.pack(f"<{t.ndim}Q", *t.shape),
                  struct.pack("<Q", len(data)), data]
    elif isinstance(value, bool):
        parts += [struct.pack("<BB", 3, int(value))]
    elif isinstance(value, int):
        parts += [struct.pack("<Bq", 1, value)]
    elif isinstance(value, float):
        parts += [struct.pack("<Bd", 2, value)]
    elif isinstance(value, str):
        s = value.encode("utf-8")
        parts += [struct.pack("<BI", 4, len(s)), s]
    else:
        raise TypeError(f"save_checkpoint: entry {name!r} is a {type(value).__name__}; entries are tensors, arrays, "
                        "ints, floats, bools and strs")
    return b"".join(parts)


def save_checkpoint(save_obj, ckpt_file_name, integrated_save=True, async_save=False, append_dict=None,
                    enc_key=None, enc_mode="AES-GCM", choice_func=None, **kwargs):
    """Writes save_obj (a Cell, an optimizer, a dict name -> tensor, a list of {"name", "data"}
    dicts, or a list of those) and append_dict (name -> tensor or number or str) to ckpt_file_name
    (".ckpt" appended when it has no suffix). choice_func(name) -> bool keeps the entries it accepts.
    The file is written to a temporary name and moved in place, so a crash never leaves half a file."""
    if enc_key is not None:
        raise ValueError("save_checkpoint: encrypted checkpoints (enc_key) are not supported")
    entries = _entries_of(save_obj, append_dict)
    if choice_func is not None:
        entries = [(n, v) for n, v in entries if choice_func(n)]
    payload = struct.pack("<I", len(entries)) + b"".join(_encode(n, v) for n, v in entries)
    path = os.fspath(ckpt_file_name)
    if not os.path.splitext(path)[1]:
        path += ".ckpt"
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(_HEADER.pack(MAGIC, VERSION, 0, len(payload), zlib.crc32(payload)))
        f.write(payload)
    os.replace(tmp, path)
    return path


# ---- reading ------------------------------------------------------------------------------

class _Reader:
    def __init__(self, data, where):
        self.data, self.pos, self.where = data, 0, where

    def fail(self, what):
        raise CheckpointError(f"{self.where}: {what} (at byte {self.pos + _HEADER.size})")

    def take(self, n, what):
        if n < 0 or n > len(self.data) - self.pos:
            self.fail(f"{what} of {n} bytes runs past the end of the file")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt, what):
        s = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(s, what))

    def text(self, n, what):
        raw = self.take(n, what)
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8 text")
        if "\0" in s:
            self.fail(f"{what} holds a NUL byte")
        return s


def _parse(data, where):
    if len(data) < _HEADER.size:
        raise CheckpointError(f"{where}: not a kiln checkpoint (a file of {len(data)} bytes)")
    magic, version, flags, length, crc = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CheckpointError(f"{where}: not a kiln checkpoint (no KILNCKPT magic)")
    if version != VERSION:
        raise CheckpointError(f"{where}: checkpoint format version {version}; this kiln reads version {VERSION}")
    if flags != 0:
        raise CheckpointError(f"{where}: unknown flags {flags:#x}")
    payload = data[_HEADER.size:]
    if length != len(payload):
        raise CheckpointError(f"{where}: the header says {length} payload bytes, the file holds {len(payload)} "
                              "(truncated or extended)")
    if zlib.crc32(payload) != crc:
        raise CheckpointError(f"{where}: checksum mismatch (the file is corrupt)")
    r = _Reader(payload, where)
    (count,) = r.unpack("<I", "the entry count")
    if count > len(payload) // 6:  # (every entry takes at least 6 bytes)
        r.fail(f"{count} entries cannot fit in {len(payload)} bytes")
    out = {}
    for k in range(count):
        (n,) = r.unpack("<I", f"entry {k}'s name length")
        if n == 0 or n > _MAX_NAME:
            r.fail(f"entry {k}'s name length {n} is out of range")
        name = r.text(n, f"entry {k}'s name")
        if name in out:
            r.fail(f"two entries are named {name!r}")
        (kind,) = r.unpack("<B", f"{name!r}'s kind")
        if kind == 0:
            code, ndim = r.unpack("<BB", f"{name!r}'s dtype and rank")
            if code not in _DTYPES:
                r.fail(f"{name!r} has an unknown dtype code {code}")
            if ndim > _MAX_NDIM:
                r.fail(f"{name!r} has {ndim} dimensions (at most {_MAX_NDIM})")
            shape = r.unpack(f"<{ndim}Q", f"{name!r}'s sizes")
            (nbytes,) = r.unpack("<Q", f"{name!r}'s byte count")
            item = 2 if _DTYPES[code] == "bfloat16" else np.dtype(_NP[_DTYPES[code]]).itemsize
            elems = 1
            for s in shape:  # (sizes checked against the bytes the file has before any allocation)
                elems *= s
                if elems * item > len(payload):
                    r.fail(f"{name!r} of shape {list(shape)} needs more bytes than the file holds")
            if nbytes != elems * item:
                r.fail(f"{name!r} of shape {list(shape)} and dtype {_DTYPES[code]} should have {elems * item} bytes, "
                       f"the file says {nbytes}")
            raw = r.take(nbytes, f"{name!r}'s data")
            out[name] = _tensor_from(raw, _DTYPES[code], shape)
        elif kind == 1:
            out[name] = r.unpack("<q", f"{name!r}'s int")[0]
        elif kind == 2:
            out[name] = r.unpack("<d", f"{name!r}'s float")[0]
        elif kind == 3:
            (b,) = r.unpack("<B", f"{name!r}'s bool")
            if b > 1:
                r.fail(f"{name!r}'s bool is {b}")
            out[name] = bool(b)
        elif kind == 4:
            (n,) = r.unpack("<I", f"{name!r}'s text length")
            out[name] = r.text(n, f"{name!r}'s text")
        else:
            r.fail(f"{name!r} has an unknown kind {kind}")
    if r.pos != len(payload):
        r.fail(f"{len(payload) - r.pos} bytes follow the last entry")
    return out


def _tensor_from(raw, dtype, shape):
    if dtype == "bfloat16":
        bits = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
        return Tensor(bits.view(np.float32).reshape(shape), _C.bfloat16)
    return Tensor(np.frombuffer(raw, _NP[dtype]).reshape(shape).copy(), getattr(_C, dtype))


def read_checkpoint(ckpt_file_name):
    """name -> Tensor or number or str of a checkpoint file (bytes are accepted too)."""
    if isinstance(ckpt_file_name, (bytes, bytearray)):
        return _parse(bytes(ckpt_file_name), "checkpoint bytes")
    path = os.fspath(ckpt_file_name)
    with open(path, "rb") as f:
        data = f.read()
    return _parse(data, path)


def load_checkpoint(ckpt_file_name, net=None, strict_load=False, filter_prefix=None, dec_key=None,
                    dec_mode="AES-GCM", specify_prefix=None, choice_func=None, **kwargs):
    """name -> Parameter (tensors; numbers and strs as they are) of a checkpoint; with net, also
    loaded into it (load_param_into_net). filter_prefix: names starting with it (a str or a tuple)
    are left out; specify_prefix: only names starting with it are kept; choice_func(name) -> bool."""
    from .nn import Parameter

    if dec_key is not None:
        raise ValueError("load_checkpoint: encrypted checkpoints (dec_key) are not supported")
    entries = read_checkpoint(ckpt_file_name)
    out = {}
    for name, v in entries.items():
        if filter_prefix is not None and name.startswith(filter_prefix if isinstance(filter_prefix, str)
                                                         else tuple(filter_prefix)):
            continue
        if specify_prefix is not None and not name.startswith(specify_prefix if isinstance(specify_prefix, str)
                                                              else tuple(specify_prefix)):
            continue
        if choice_func is not None and not choice_func(name):
            continue
        out[name] = Parameter(v, name=name, requires_grad=v.dtype.is_floating_point) \
            if isinstance(v, _C.TensorBase) else v
    if net is not None:
        load_param_into_net(net, out, strict_load)
    return out
