"""User-facing errors: one line saying what is wrong, where, and how to fix it."""


class BurnoutError(Exception):
    """A problem with the user's input. The CLI prints it as one line and exits with code 2."""

    exit_code = 2


class StorageError(BurnoutError):
    """The disk refused: full, read-only, or a path that cannot be written. One line, exit code 74
    (EX_IOERR); the CLI reports any other OSError the same way."""

    exit_code = 74
