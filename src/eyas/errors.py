"""The one exception type users see: what is wrong, what was expected, how to fix it."""


class EyasError(ValueError):
    """A configuration or input problem, with a message written for the person who can fix it.

    Messages follow one shape: what is wrong, what was expected, and the fix (a flag, a path, a
    command). The command line prints them without a traceback.
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")
