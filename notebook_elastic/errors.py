"""Errors users read: one family per stage, each message names the input and the fix."""


class NotebookElasticError(Exception):
    """Base of every error notebook-elastic raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows of it in a notebook: its one sentence, not thirty lines of our code
        (#39 item 1: a drill on a finished job). The whole traceback stays on the exception:
        ``import sys, traceback; traceback.print_exception(sys.last_value)``, or ``%debug``."""
        cause = self.__cause__
        said = [f"{type(self).__name__}: {self}"]
        if cause is not None:
            said.append(f"  (from {type(cause).__name__}: {cause})")
        return said


class SpecError(NotebookElasticError, ValueError):
    """A job option is invalid (bad flag value, bad name, ...); nothing was launched."""


class PackagingError(NotebookElasticError):
    """The cell cannot be shipped as it is (undefined name, unpicklable value, ...)."""


class BackendError(NotebookElasticError):
    """The backend could not do what was asked (launch, scale, stop, attach, ...)."""


class JobNotFound(BackendError, LookupError):
    """No job of that name exists for this backend."""
