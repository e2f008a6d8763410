"""Errors: one MegatrainError subclass for each mt_status, carrying the
library's message.

Catch MegatrainError for any failure of the library, or a subclass for one
kind: ``except megatrain.HostBudgetError`` to try a smaller batch. The
subclasses that have a natural Python counterpart also derive from it
(InvalidArgumentError is a ValueError, OutOfHostMemoryError a MemoryError),
so generic handlers catch them too."""

from __future__ import annotations

import enum
from typing import Dict, Type

from . import _lib


class Status(enum.IntEnum):
    """The library's mt_status codes."""
    OK = 0
    INVALID_ARGUMENT = 1
    STRUCT_SIZE = 2
    OUT_OF_HOST_MEMORY = 3
    HOST_BUDGET = 4
    GPU_BUDGET = 5
    OUT_OF_GPU_MEMORY = 6
    NO_DEVICE = 7
    DEVICE = 8
    IO = 9
    FORMAT = 10
    UNSUPPORTED = 11
    NONFINITE = 12
    ABORTED = 13
    INTERNAL = 14


class MegatrainError(Exception):
    """A call into libmegatrain failed.

    Attributes:
        status: the mt_status the call returned (a Status where it is known).
        message: the library's message for this failure (mt_model_errmsg or
            mt_last_errmsg), or its status's description when it left none.
    """

    status: int = -1

    def __init__(self, status: int, message: str = ""):
        try:
            status = Status(status)
        except ValueError:
            pass  # a status newer than this package: still an error, with the library's own words
        self.status = status
        self.message = message or status_str(status)
        super().__init__(f"{status_str(status)}: {self.message}" if message else self.message)


class InvalidArgumentError(MegatrainError, ValueError):
    """MT_ERR_INVALID_ARGUMENT: a bad value or an inconsistent configuration."""


class StructSizeError(MegatrainError):
    """MT_ERR_STRUCT_SIZE: a struct the library does not know (a binding bug)."""


class OutOfHostMemoryError(MegatrainError, MemoryError):
    """MT_ERR_OUT_OF_HOST_MEMORY: an allocation of host memory failed."""


class HostBudgetError(MegatrainError):
    """MT_ERR_HOST_BUDGET: the plan needs more host memory than the budget or the machine has."""


class GPUBudgetError(MegatrainError):
    """MT_ERR_GPU_BUDGET: the plan needs more GPU memory than the budget or the device has."""


class OutOfGPUMemoryError(MegatrainError, MemoryError):
    """MT_ERR_OUT_OF_GPU_MEMORY: a GPU allocation failed."""


class NoDeviceError(MegatrainError):
    """MT_ERR_NO_DEVICE: the policy asks for a backend this machine lacks."""


class DeviceError(MegatrainError):
    """MT_ERR_DEVICE: the GPU runtime reported an error."""


class IOFailedError(MegatrainError):
    """MT_ERR_IO: a file could not be opened, read or written."""


class FormatError(MegatrainError):
    """MT_ERR_FORMAT: a file is corrupt, truncated or not of the expected format."""


class UnsupportedError(MegatrainError):
    """MT_ERR_UNSUPPORTED: valid, but not supported by this build or architecture."""


class NonFiniteError(MegatrainError, ArithmeticError):
    """MT_ERR_NONFINITE: a loss or gradient norm was NaN or infinite; nothing was updated."""


class AbortedError(MegatrainError):
    """MT_ERR_ABORTED: the abort callback (or Model.interrupt) asked to stop;
    the model is as it was before the call."""


class InternalError(MegatrainError):
    """MT_ERR_INTERNAL: a bug in the library (please report it)."""


_BY_STATUS: Dict[int, Type[MegatrainError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError, Status.STRUCT_SIZE: StructSizeError,
    Status.OUT_OF_HOST_MEMORY: OutOfHostMemoryError, Status.HOST_BUDGET: HostBudgetError,
    Status.GPU_BUDGET: GPUBudgetError, Status.OUT_OF_GPU_MEMORY: OutOfGPUMemoryError,
    Status.NO_DEVICE: NoDeviceError, Status.DEVICE: DeviceError, Status.IO: IOFailedError,
    Status.FORMAT: FormatError, Status.UNSUPPORTED: UnsupportedError, Status.NONFINITE: NonFiniteError,
    Status.ABORTED: AbortedError, Status.INTERNAL: InternalError,
}


def status_str(status: int) -> str:
    """The library's English description of a status (mt_status_str)."""
    return _lib.text(_lib.lib.mt_status_str(int(status)))


def error_for(status: int, message: str = "") -> MegatrainError:
    """The exception for a failed call's status and message."""
    return _BY_STATUS.get(status, MegatrainError)(status, message)


def check(status: int, model=None) -> None:
    """Raises the status's exception unless it is MT_OK. model: the handle
    whose mt_model_errmsg holds the message; None for the calls that leave it
    in mt_last_errmsg (which is per thread, and read on the same thread)."""
    if status == 0:
        return
    msg = _lib.lib.mt_model_errmsg(model) if model else _lib.lib.mt_last_errmsg()
    raise error_for(status, _lib.text(msg))
