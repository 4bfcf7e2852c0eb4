"""The one error type a user sees: what is wrong and what to do, on one line, exit status 2.

    raise UserError("data.corpus: no file matches 'texts/*.txt'", hint="check the path")
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake the user can fix (config, inputs, environment). Never shown with a traceback."""

    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


def one_line(text: str) -> str:
    """Collapse a multi-line message so it stays a single line on the terminal."""
    return " ".join(text.split())


class UserErrors(UserError):
    """Several mistakes found at once (a config with three wrong keys): every one is shown, one
    line each, the most fundamental first, so a user fixes them in one round, not three."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = [one_line(p) for p in problems]


def error_lines(exc: UserError) -> list[str]:
    """The lines a user error is shown as: one per problem."""
    if isinstance(exc, UserErrors):
        return list(exc.problems)
    return [one_line(str(exc))]


def counted(count: int, noun: str) -> str:
    """`1 worker`, `2 workers`: a count with its noun in the right number."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
