"""Status codes and exceptions of the exactjit Python binding.

The codes are exactjit_status_t from include/exactjit/exactjit.h, one for one. A failed call raises
the Error subclass of its code, carrying the library's message (xj_last_error), which names the
argument, the rule it broke, or the path involved. Catch `exactjit.Error` for all of them, or a
subclass (e.g. `exactjit.BadIndexError`) for one kind.
"""
import enum


class Status(enum.IntEnum):
    """exactjit_status_t, without the XJ_ / XJ_ERROR_ prefix."""

    OK = 0
    INVALID_ARGUMENT = 1  # a tensor, shape, dtype or option breaks a rule
    COMPILE = 2  # NVRTC rejected the generated source
    OFFLINE_MISS = 3  # EXACTJIT_OFFLINE and the kernel is in no cache
    CUDA = 4  # a CUDA driver call failed
    BAD_INDEX = 5  # a kernel found an index out of range
    UNAVAILABLE = 6  # NVRTC or the CUDA driver could not be loaded
    IO = 7  # the cache could not be read or written
    INTERNAL = 8


class Error(RuntimeError):
    """A failed exactjit call. `code` is the exactjit_status_t value (a Status where known)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class InvalidArgumentError(Error):
    pass


class CompileError(Error):
    pass


class OfflineMissError(Error):
    pass


class CudaError(Error):
    pass


class BadIndexError(Error):
    pass


class UnavailableError(Error):
    pass


class CacheIOError(Error):
    pass


class InternalError(Error):
    pass


_BY_CODE = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.COMPILE: CompileError,
    Status.OFFLINE_MISS: OfflineMissError,
    Status.CUDA: CudaError,
    Status.BAD_INDEX: BadIndexError,
    Status.UNAVAILABLE: UnavailableError,
    Status.IO: CacheIOError,
    Status.INTERNAL: InternalError,
}


def error_for(code, message):
    """The exception for status `code` (an unknown code gives a plain Error)."""
    try:
        code = Status(code)
    except ValueError:
        return Error(code, message)
    return _BY_CODE.get(code, Error)(code, message)


def invalid_argument(message):
    """An InvalidArgumentError raised by the binding itself, before the library is called."""
    return InvalidArgumentError(Status.INVALID_ARGUMENT, message)
