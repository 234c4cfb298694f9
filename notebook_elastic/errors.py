"""Errors users read: one family per stage, each message names the input and the fix."""


class NotebookElasticError(Exception):
    """Base of every error notebook-elastic raises on purpose."""


class SpecError(NotebookElasticError, ValueError):
    """A job option is invalid (bad flag value, bad name, ...); nothing was launched."""


class PackagingError(NotebookElasticError):
    """The cell cannot be shipped as it is (undefined name, unpicklable value, ...)."""


class BackendError(NotebookElasticError):
    """The backend could not do what was asked (launch, scale, stop, attach, ...)."""


class JobNotFound(BackendError, LookupError):
    """No job of that name exists for this backend."""
