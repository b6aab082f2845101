"""Exception types raised by tilebake, so callers can tell a bad call from a bad install."""


class TilebakeError(Exception):
    """Base class of tilebake's own errors."""


class VariantNotBuiltError(TilebakeError, NotImplementedError):
    """The call needs a compile-time variant that the installed kernels do not contain."""


class KernelsNotInstalledError(TilebakeError, RuntimeError):
    """The backend's kernel package (tilebake-cuda) is not installed, or is of another version."""


class NoBinaryForDeviceError(TilebakeError, RuntimeError):
    """The GPU's architecture has no binary in the installed kernel package."""


class CorruptArtifactError(TilebakeError, RuntimeError):
    """A kernel binary or the manifest is missing, unreadable or fails its sha256 check."""


class CudaDriverError(TilebakeError, RuntimeError):
    """The CUDA driver refused a load or a launch."""


class AscendRuntimeError(TilebakeError, RuntimeError):
    """An Ascend runtime (ACL) call failed; the message names the call and its error."""
