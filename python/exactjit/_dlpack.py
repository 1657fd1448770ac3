"""ctypes mirrors of the DLPack 0.6 structs, and a DLTensor built straight from a torch tensor.

We fill DLTensors ourselves instead of going through torch.utils.dlpack: a capsule costs an
allocation, a deleter and a round trip through ATen per tensor per call, and the library only
borrows the tensor for the duration of the call anyway. torch is never imported here; the
tensor's own methods are all we use.
"""
import ctypes

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


_dtype_codes = None  # torch.dtype -> (DLPack code, bits); filled on first use


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


def from_torch(torch, tensor, name):
    """A DLTensor describing `tensor` (data_ptr already includes the storage offset, so
    byte_offset is 0; strides are in elements, as torch keeps them).

    The shape and stride arrays are owned by the returned struct: ctypes keeps an array assigned
    to a pointer field alive in the struct's _objects, so they live as long as the struct does.
    Dtypes and devices DLPack 0.6 cannot describe raise InvalidArgumentError; every rule about
    what the op accepts is checked by the library, which names the rule.
    """
    global _dtype_codes
    if _dtype_codes is None:
        _dtype_codes = _dtype_table(torch)
    dtype = _dtype_codes.get(tensor.dtype)
    if dtype is None:
        raise invalid_argument(f"{name}: dtype {tensor.dtype} has no DLPack 0.6 type code")
    if tensor.is_cuda:
        device = DLDevice(kDLCUDA, tensor.get_device())
    elif tensor.device.type == "cpu":
        device = DLDevice(kDLCPU, 0)
    else:
        raise invalid_argument(f"{name}: a tensor on device '{tensor.device}' cannot be passed; "
                               "exactjit takes CUDA tensors")
    ndim = tensor.dim()
    shape = (ctypes.c_int64 * ndim)(*tensor.shape)
    strides = (ctypes.c_int64 * ndim)(*tensor.stride())
    return DLTensor(tensor.data_ptr(), device, ndim, DLDataType(dtype[0], dtype[1], 1),
                    shape, strides, 0)
