"""The error types a user can act on: each message names the problem and the fix, in one line."""

import errno

# OSErrors of the disk or of permissions: the user frees space or fixes access, then reruns.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


class ConfigError(ValueError):
    """A configuration, file or argument that cannot be used as given."""


class RunStopped(RuntimeError):
    """A run stopped for a reason the user can act on; `exit_code` tells the shell which."""
    exit_code = 1
