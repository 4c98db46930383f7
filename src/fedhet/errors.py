"""The one error type users see: a message that says what is wrong and how to fix it."""


class FedhetError(Exception):
    """Bad input or an unusable environment. The CLI prints `error: <message>` and exits 2."""
