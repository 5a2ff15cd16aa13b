"""What ``--allow-global`` may add to a weights-only load: plain data classes, nothing that runs code.

PyTorch's weights-only unpickler calls any allow-listed global through the pickle ``REDUCE``
opcode with arguments the file chooses, and builds allow-listed classes through ``NEWOBJ`` and
``BUILD``. So an allow-listed *function* (``builtins.exec``, ``os.system``, ``builtins.getattr``)
is code execution, and so is a class whose construction acts on the machine
(``subprocess.Popen``, ``functools.partial``, ``ctypes.CDLL``, ``logging.FileHandler``, which
truncates a file). The rule, applied to every name before the file is read:

1. the module root (``os`` of ``os.path``) is not in :data:`DENIED_ROOTS`, modules that reach the
   operating system, the file system, the network or the interpreter; this is checked before
   anything is imported, since importing a module runs it;
2. the name is not in :data:`DENIED_NAMES` (single classes of otherwise harmless packages that
   open files or load code);
3. nothing is imported that is not known to be import-safe: the class comes from a module
   that is already imported, or from a package of :data:`IMPORT_SAFE_ROOTS` (modules that only
   define things when imported); a ``__main__`` module (which runs its program when imported,
   as ``lib2to3.__main__`` does) is refused even then. Importing a module runs it, so checking a
   name by importing an arbitrary module would itself run code;
4. the object is a class (functions, builtins, methods, modules and instances are
   refused), and the class it really is (its ``__module__``) passes rules 1 and 2, so a
   re-export such as ``mypkg.Popen = subprocess.Popen`` is caught;
5. no class in its method resolution order comes from a denied module, except the plain data
   builtins of :data:`DATA_BUILTINS` (``object``, ``dict``, ``tuple``...), so a subclass of
   ``subprocess.Popen``, ``functools.partial`` or ``threading.Thread`` is refused, and so is a
   metaclass (a subclass of ``type``).

The rule cannot know every class in a user's environment; it makes the option mean what it
says (admit plain data stored next to the weights) and removes the known ways to run code
through it. Code from a file runs only under ``--trust-checkpoint``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from curvcal.errors import InputError

#: Module roots whose classes or functions reach the OS, files, network or the interpreter.
DENIED_ROOTS = frozenset(
    {
        # the interpreter: code, imports, frames, objects
        "builtins", "__builtin__", "sys", "importlib", "imp", "zipimport", "pkgutil", "runpy",
        "code", "codeop", "compileall", "py_compile", "types", "inspect", "gc", "ctypes",
        "_ctypes", "cffi", "marshal", "pickle", "_pickle", "pickletools", "copyreg", "copy",
        "dill", "cloudpickle", "joblib", "functools", "_functools", "operator", "_operator",
        "weakref", "_weakref", "atexit", "threading", "_thread", "signal", "faulthandler",
        "trace", "tracemalloc", "pdb", "bdb", "profile", "cProfile", "timeit", "doctest",
        "unittest", "pydoc", "site", "sysconfig", "ensurepip", "venv", "distutils",
        "setuptools", "pip", "ast", "dis", "symtable", "contextvars", "asyncio",
        "concurrent", "multiprocessing", "_multiprocessing", "__main__",
        # the operating system and the file system
        "os", "posix", "nt", "posixpath", "ntpath", "subprocess", "_posixsubprocess", "pty",
        "tty", "termios", "fcntl", "resource", "grp", "pwd", "shutil", "tempfile", "pathlib",
        "glob", "fnmatch", "fileinput", "filecmp", "io", "_io", "mmap", "platform", "logging",
        "zipfile", "tarfile", "gzip", "bz2", "lzma", "zlib", "shelve", "dbm", "sqlite3",
        "_sqlite3", "webbrowser", "antigravity", "this", "tkinter", "turtle", "idlelib",
        "curses", "readline", "rlcompleter",
        # the network
        "socket", "_socket", "ssl", "select", "selectors", "socketserver", "http", "urllib",
        "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "xmlrpc", "wsgiref", "email",
        "mailbox", "requests", "urllib3", "aiohttp",
    }
)  # fmt: skip

#: Single classes of otherwise harmless packages that open files, load code or start processes.
DENIED_NAMES = frozenset(
    {
        "numpy.memmap",
        "numpy.lib.npyio.DataSource",
        "torch.package.PackageImporter",
        "torch.package.PackageExporter",
        "torch.jit.ScriptModule",
        "torch.jit.ScriptFunction",
        "torch.utils.data.DataLoader",
    }
)

#: Packages whose modules only define classes and functions when imported: the only modules
#: ``--allow-global`` imports itself (any other module must already be imported).
IMPORT_SAFE_ROOTS = frozenset(
    {
        "argparse", "collections", "dataclasses", "datetime", "decimal", "enum", "fractions",
        "ipaddress", "numbers", "typing", "uuid", "zoneinfo", "numpy", "torch",
    }
)  # fmt: skip

#: The only builtins a plain data class may inherit from.
DATA_BUILTINS = frozenset(
    {object, int, float, complex, bool, str, bytes, bytearray, tuple, list, dict, set, frozenset}
)

_ONLY_TRUST = "only --trust-checkpoint runs code from a file"


def allowed_classes(names: tuple[str, ...]) -> list[type]:
    """Import each ``module.Class`` given with ``--allow-global`` and check it against the rule
    of this module; raise :class:`InputError` naming the first one that breaks it."""
    return [allowed_class(name) for name in names]


def allowed_class(name: str) -> type:
    """The class ``name`` (``module.Class``) if ``--allow-global`` may admit it (see the module
    docstring); :class:`InputError` naming it otherwise."""
    what = f"--allow-global {name}"
    module_name, _, attr = name.rpartition(".")
    if not module_name or not attr:
        raise InputError(what, "is not a module.Class path")
    reason = _denied_name(name)
    if reason is not None:
        raise InputError(what, reason, _hint())
    module = _module_without_effects(module_name, what)
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise InputError(what, f"cannot be imported: {exc}") from exc
    if not isinstance(obj, type):
        kind = "a function" if callable(obj) else f"a {type(obj).__name__}"
        raise InputError(
            what, f"is {kind}, not a class; only plain data classes may be allow-listed", _hint()
        )
    for base in obj.__mro__:
        if base in DATA_BUILTINS:
            continue
        base_name = f"{base.__module__}.{base.__qualname__}"
        reason = _denied_name(base_name)
        if reason is not None:
            relation = "is" if base is obj else "derives from"
            raise InputError(what, f"{relation} {base_name}: {reason}", _hint())
    return obj


def could_be_allowed(name: str) -> bool:
    """Whether suggesting ``--allow-global name`` makes sense, judged without importing
    anything the file names: not denied, and, when its module is already imported, a class
    that passes :func:`allowed_class` and is not a torch module (whole modules need trust)."""
    if _denied_name(name) is not None:
        return False
    module_name, _, attr = name.rpartition(".")
    if _runs_at_import(module_name):
        return False
    module = sys.modules.get(module_name)
    if module is None:
        # never imported here: suggest it only from a package known to be import-safe, and
        # only for a class by the usual naming (a function is refused anyway)
        return module_name.split(".", 1)[0] in IMPORT_SAFE_ROOTS and attr[:1].isupper()
    obj = getattr(module, attr, None)
    if not isinstance(obj, type):
        return False
    try:
        allowed_class(name)
    except InputError:
        return False
    import torch

    return not issubclass(obj, torch.nn.Module)


def _runs_at_import(module_name: str) -> bool:
    """A ``__main__`` module: a package's program, run when the module is imported."""
    return "__main__" in module_name.split(".")


def _module_without_effects(module_name: str, what: str) -> ModuleType:
    """The module ``module_name`` when it is already imported, or when it belongs to a package
    of :data:`IMPORT_SAFE_ROOTS` (then imported); :class:`InputError` otherwise, before
    anything runs (a missing top-level package is found without importing anything)."""
    if _runs_at_import(module_name):
        raise InputError(
            what,
            f"{module_name} is a __main__ module, which runs its program when imported",
            _hint(),
        )
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    root = module_name.split(".", 1)[0]
    if root not in IMPORT_SAFE_ROOTS:
        try:
            found = importlib.util.find_spec(root) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise InputError(what, f"cannot be imported: No module named {root!r}")
        raise InputError(
            what,
            f"its module {module_name} is not imported, and importing a module runs its code; "
            f"curvcal imports only modules of {', '.join(sorted(IMPORT_SAFE_ROOTS))} to check "
            "a name",
            f"{_ONLY_TRUST}: use it if you trust the file and {root}",
        )
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(what, f"cannot be imported: {exc}") from exc


def _denied_name(name: str) -> str | None:
    root = name.split(".", 1)[0]
    if root in DENIED_ROOTS:
        return f"{root} is a module that can reach the operating system or the interpreter"
    if any(name == denied or name.startswith(denied + ".") for denied in DENIED_NAMES):
        return f"{name} opens files, loads code or starts processes"
    return None


def _hint() -> str:
    return f"{_ONLY_TRUST}; --allow-global admits plain data classes and never enables code"
