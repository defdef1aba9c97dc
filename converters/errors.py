"""Exit codes of `eagle-zoo convert` and the errors that carry them.

Errors raised by eagle_zoo.checkpoints.tensors (bad or unsafe input files) and
eagle_zoo.hub (ids that cannot be resolved) are mapped in ``exit_code_for``.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_UNEXPECTED = 1      # a bug or an OS failure (disk full, permissions)
EXIT_BAD_INPUT = 2       # usage, missing/corrupt/mismatched input
EXIT_OUTPUT_EXISTS = 3   # OUT exists and --force was not given
EXIT_UNSAFE = 4          # a pickle holds more than tensors; it was not unpickled
EXIT_INEXPRESSIBLE = 5   # the head uses something the output format cannot express
EXIT_INTERRUPTED = 130   # Ctrl-C; nothing was left at OUT

EXIT_CODES_HELP = """\
exit codes:
  0    converted (or --dry-run printed the plan)
  1    unexpected error (a bug, or the OS refused: disk full, permissions)
  2    usage error or bad input (missing file, corrupt or truncated weights,
       target whose vocab/hidden size does not match the head)
  3    the output exists; pass --force to replace it
  4    a pickled file holds objects other than tensors; refused, nothing executed
  5    the head uses features the output format cannot express
  130  interrupted
On every non-zero exit nothing is left at OUT (an existing OUT is untouched)."""


class ConvertError(Exception):
    """A conversion cannot proceed; the message names the file/key and the fix."""

    exit_code = EXIT_BAD_INPUT


class OutputExistsError(ConvertError):
    exit_code = EXIT_OUTPUT_EXISTS


class InexpressibleError(ConvertError):
    exit_code = EXIT_INEXPRESSIBLE


def exit_code_for(exc: BaseException) -> int | None:
    """The documented exit code of a known error, None for an unexpected one."""
    from eagle_zoo.checkpoints.tensors import CheckpointError, UnsafeCheckpointError
    from eagle_zoo.hub import HubError

    if isinstance(exc, ConvertError):
        return exc.exit_code
    if isinstance(exc, UnsafeCheckpointError):
        return EXIT_UNSAFE
    if isinstance(exc, (CheckpointError, HubError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return None
