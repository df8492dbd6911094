"""User-facing errors: one line saying what is wrong, where, and how to fix it."""


class BurnoutError(Exception):
    """A problem with the user's input. The CLI prints it as one line and exits with code 2."""

    exit_code = 2
