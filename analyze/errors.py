"""Errors that mean "bad input": the CLI prints them as one line and exits 2."""

from __future__ import annotations


class InputError(Exception):
    """The input cannot be analysed; ``str(e)`` says what is wrong and what to do."""

    def __init__(self, message: str, code: str = "BAD_INPUT"):
        super().__init__(message)
        self.code = code
