"""ctypes mirrors of the DLPack 0.6 structs, and DLTensors built straight from torch tensors.

We fill DLTensors ourselves instead of going through torch.utils.dlpack: a capsule costs an
allocation, a deleter and a round trip through ATen per tensor per call, and the library only
borrows the tensors for the duration of the call anyway. torch is never imported here; the
tensors' own methods are all we use.

NOTE: the structs below document the layout; the ops do not build them field by field. pack()
writes all the DLTensors of one call, with their shape and stride arrays, into one ctypes buffer
with struct.pack_into, and keeps that buffer per thread for the call's metadata (op, shapes,
strides, dtypes, devices): a call with the metadata of an earlier one only writes the data
pointers. Host time is on the critical path at small S; docs/perf-notes.md has the numbers.
The layout is checked against the mirrors at import.
"""
import ctypes
import struct
import threading

from ._errors import invalid_argument

kDLCPU = 1
kDLCUDA = 2

kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLComplex = 5


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# data, device {type, id}, ndim, dtype {code, bits, lanes}, shape*, strides*, byte_offset
_TENSOR = struct.Struct("=QiiiBBHQQQ")
assert _TENSOR.size == ctypes.sizeof(DLTensor) and DLTensor.shape.offset == 24, \
    "DLTensor layout differs from the packed format"
_DIMS = [struct.Struct(f"={2 * n}q") for n in range(9)]  # shape then strides, for ndim <= 8

_POINTER = struct.Struct("=Q")
_dtype_codes = None  # torch.dtype -> (DLPack code, bits); filled on first use
_MAX_CACHED = 512  # packed calls kept per thread; the cache starts over beyond that
_cache = threading.local()


def _dtype_table(torch):
    table = {
        torch.bfloat16: (kDLBfloat, 16),
        torch.float16: (kDLFloat, 16),
        torch.float32: (kDLFloat, 32),
        torch.float64: (kDLFloat, 64),
        torch.int8: (kDLInt, 8),
        torch.int16: (kDLInt, 16),
        torch.int32: (kDLInt, 32),
        torch.int64: (kDLInt, 64),
        torch.uint8: (kDLUInt, 8),
        torch.complex64: (kDLComplex, 64),
        torch.complex128: (kDLComplex, 128),
    }
    for name, bits in (("uint16", 16), ("uint32", 32), ("uint64", 64)):  # newer torch only
        if hasattr(torch, name):
            table[getattr(torch, name)] = (kDLUInt, bits)
    return table


def pack(torch, op, names, tensors):
    """DLTensors for `tensors`, packed into one buffer: returns (buffer, addresses), one
    DLTensor* address per tensor. The addresses point into the buffer, so the caller keeps the
    buffer referenced until the C call returns. The buffer is this thread's for calls of `op`
    with the same metadata; only the data pointers are written again.

    data_ptr() already includes the storage offset, so byte_offset is 0; strides are in
    elements, as torch keeps them. Dtypes and devices DLPack 0.6 cannot describe raise
    InvalidArgumentError naming `op` and the argument; every rule about what an op accepts is
    left to the library, which names the rule.
    """
    key = (op,) + tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)
    cache = getattr(_cache, "calls", None)
    if cache is None:
        cache = _cache.calls = {}
    hit = cache.get(key)
    if hit is not None:
        buffer, addresses = hit
        for k, tensor in enumerate(tensors):
            _POINTER.pack_into(buffer, _TENSOR.size * k, tensor.data_ptr())
        return hit
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    packed = _pack_new(torch, op, names, tensors)
    cache[key] = packed
    return packed


def _pack_new(torch, op, names, tensors):
    global _dtype_codes
    if _dtype_codes is None:
        _dtype_codes = _dtype_table(torch)
    ndims = [t.dim() for t in tensors]
    arrays = _TENSOR.size * len(tensors)
    buffer = ctypes.create_string_buffer(arrays + 16 * sum(ndims))
    base = ctypes.addressof(buffer)
    addresses = []
    for k, tensor in enumerate(tensors):
        dtype = _dtype_codes.get(tensor.dtype)
        if dtype is None:
            raise invalid_argument(
                f"{op}: {names[k]}: dtype {tensor.dtype} has no DLPack 0.6 type code")
        if tensor.is_cuda:
            device_type, device_id = kDLCUDA, tensor.get_device()
        elif tensor.device.type == "cpu":
            device_type, device_id = kDLCPU, 0
        else:
            raise invalid_argument(f"{op}: {names[k]}: a tensor on device '{tensor.device}' "
                                   "cannot be passed; exactjit takes CUDA tensors")
        n = ndims[k]
        dims = _DIMS[n] if n < len(_DIMS) else struct.Struct(f"={2 * n}q")
        dims.pack_into(buffer, arrays, *tensor.shape, *tensor.stride())
        _TENSOR.pack_into(buffer, _TENSOR.size * k, tensor.data_ptr(), device_type, device_id, n,
                          dtype[0], dtype[1], 1, base + arrays, base + arrays + 8 * n, 0)
        addresses.append(base + _TENSOR.size * k)
        arrays += 16 * n
    return buffer, addresses


def from_torch(torch, tensor, name="tensor"):
    """One DLTensor describing `tensor`, for callers of other C APIs; it owns its shape and
    stride arrays (from_buffer keeps the packed buffer alive)."""
    buffer, _ = _pack_new(torch, "from_torch", (name,), (tensor,))
    return DLTensor.from_buffer(buffer)
