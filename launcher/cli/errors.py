"""One table from exception types to the one line the user sees, and click's usage errors.

    message = next((m for t, m in error_messages().items() if isinstance(exc, t)), None)
"""

from __future__ import annotations

from payload.core.errors import UserError, error_lines, one_line


def error_messages():
    """One table: exception type -> the one line the user sees."""
    from launcher.executors import WorkerUnreachable

    return {
        UserError: lambda e: "\n".join(error_lines(e)),
        WorkerUnreachable: lambda e: one_line(f"{e}; {e.hint}" if e.hint else str(e)),
    }


def usage_line(exc) -> str:
    """A usage error (a bad option, value or command, as click words it) on one line."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return one_line(exc.format_message()).rstrip(".") + where
