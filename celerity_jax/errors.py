"""The one error type for bad user input: its message names the problem and the fix."""


class ConfigError(ValueError):
    """A configuration, file or argument that cannot be used as given."""
