"""Output paths of the commands (``--out``, ``--output``, ``--json-out``), checked before any model loads or
any work runs: a path under a file, a folder where a file is wanted (or the reverse), or a place nobody can
write used to end in a traceback, some only after the whole run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import EyasError


def check_output_folder(path, flag: str) -> Path:
    """``path`` as a folder a command can create (with its parents) or write into; ``flag`` names it in the
    message (``--out``, or ``the recipe's output``)."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise EyasError(f"{flag} {out} is a file, not a folder: the results are written into a folder",
                        f"pass a new or existing folder, e.g. {flag} {_beside(out, out.name + '-out')}")
    _check_parents(out, flag, "folder")
    return out


def check_output_file(path, flag: str, example: str) -> Path:
    """``path`` as a file a command can create (with its folders) or overwrite; ``example`` is a file name
    the fix suggests inside a folder passed by mistake."""
    out = Path(path)
    if out.is_dir():
        raise EyasError(f"{flag} {out} is a folder, not a file", f"pass a file, e.g. {flag} {out / example}")
    if out.exists():  # overwritten in place: its folder needs no new entry
        if not os.access(out, os.W_OK):
            raise EyasError(f"{flag} {out} cannot be written: the file is read-only",
                            f"make it writable (chmod u+w {out}) or pass another file")
        return out
    _check_parents(out, flag, "file")
    return out


def _check_parents(out: Path, flag: str, kind: str) -> None:
    """The nearest existing folder above ``out`` (``out`` itself where it is one) is a folder this process
    can create files in: a file there would make the mkdir fail, a read-only place the first write."""
    above = next((p for p in (out, *out.parents) if p.exists()), None)
    if above is None:  # not even the current folder exists (removed under the process): mkdir says why
        return
    if not above.is_dir():
        raise EyasError(f"{flag} {out} cannot be made: {above} is a file, not a folder",
                        f"pass a path that does not go through {above.name}, e.g. {flag} "
                        f"{_beside(above, _flat(above, out))}")
    problem = _unwritable(above)
    if problem:
        raise EyasError(f"{flag} {out} cannot be made: nothing can be created in {above} ({problem})",
                        f"pass a path in a folder you can write to, e.g. under {Path.home()} or the current folder")


def _unwritable(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` (read-only, no permission, a pseudo file system), or None.
    Tried for real, with a file removed at once: os.access says yes to root on read-only mounts' folders."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        fd, name = tempfile.mkstemp(prefix=".eyas-write-check-", dir=folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(fd)
    os.unlink(name)
    return None


def _beside(path: Path, name: str) -> Path:
    return path.parent / name if str(path.parent) != "." else Path(name)


def _flat(file: Path, out: Path) -> str:
    """``somefile.txt/x.json`` -> ``somefile-x.json``: the path made a sibling of the file in the way."""
    rest = out.relative_to(file)
    return f"{file.stem}-{'-'.join(rest.parts)}" if rest.parts else f"{file.stem}-out"
