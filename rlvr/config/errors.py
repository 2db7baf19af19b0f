"""The one exception the config layer raises (a leaf module: loading and validation both import it)."""


class ConfigError(ValueError):
    """A config that cannot be built: the message names the key and the fix."""
