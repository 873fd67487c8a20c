# SPDX-License-Identifier: BSD-3-Clause
"""_library.py — finds and loads libmall.so with ctypes and declares the C API's prototypes.

Contract: load() returns one _Api per library path (cached), with argtypes/restype set on every
function the module uses, after checking that the loaded library's API major version is the one
this module was written for. It raises MallError (code MALL_ERR_SYSTEM or MALL_ERR_VERSION) with
every place it looked when no usable library is found; it never touches the process otherwise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from ._errors import MALL_ERR_SYSTEM, MALL_ERR_VERSION, MallError

# The C API version this module speaks (mall.h: MALL_API_VERSION = major*10000 + minor*100 + patch).
EXPECTED_API_MAJOR = 0
MINIMUM_API_VERSION = 100  # 0.1.0: every function used below exists

MALL_MAX_CPUS = 1024
MALL_CPULIST_MAX = 4096
_ERROR_TEXT_SIZE = 160

# The shared object names, the versioned one first (what the runtime loader would pick).
_LIBRARY_NAMES = ("libmall.so.0", "libmall.so")


class MallAllocStruct(ctypes.Structure):
    """mall_alloc_t from mall.h; ctypes applies the same alignment as the C compiler."""

    _fields_ = [
        ("generation", ctypes.c_uint64),
        ("ncpus", ctypes.c_int),
        ("nthreads", ctypes.c_int),  # since API 0.3.0, in what was padding: the layout is unchanged
        ("mask", ctypes.c_uint64 * (MALL_MAX_CPUS // 64)),
        ("cpus", ctypes.c_char * MALL_CPULIST_MAX),
    ]


class MallErrorStruct(ctypes.Structure):
    """mall_error_t from mall.h."""

    _fields_ = [("text", ctypes.c_char * _ERROR_TEXT_SIZE)]


# void (*mall_resize_fn)(const mall_alloc_t *alloc, void *arg)
RESIZE_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(MallAllocStruct), ctypes.c_void_p)


class _Api:
    """The loaded library and its typed functions (attributes named as in mall.h)."""

    def __init__(self, path: str):
        self.path = path
        lib = ctypes.CDLL(path)
        self.lib = lib
        c_handle = ctypes.c_void_p

        def declare(name, restype, *argtypes):
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)
            setattr(self, name, fn)

        declare("mall_get_api_version", ctypes.c_int)
        declare("mall_strerror", ctypes.c_char_p, ctypes.c_int)
        declare("mall_open", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(c_handle),
                ctypes.POINTER(MallErrorStruct))
        declare("mall_step", ctypes.c_int, c_handle)
        declare("mall_get_allocation", ctypes.c_int, c_handle, ctypes.POINTER(MallAllocStruct))
        declare("mall_on_resize", ctypes.c_int, c_handle, RESIZE_FN, ctypes.c_void_p)
        declare("mall_bind_thread", ctypes.c_int, c_handle)
        declare("mall_unbind_thread", ctypes.c_int, c_handle)
        declare("mall_fd", ctypes.c_int, c_handle)
        declare("mall_report_progress", ctypes.c_int, c_handle, ctypes.c_uint64)
        declare("mall_attached", ctypes.c_int, c_handle)
        declare("mall_job_id", ctypes.c_char_p, c_handle)
        declare("mall_close", None, c_handle)

        self.version = int(self.mall_get_api_version())

    def strerror(self, rc: int) -> str:
        return self.mall_strerror(rc).decode("utf-8", "replace")


_loaded: dict[str, _Api] = {}


def version_text(version: int) -> str:
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def checkout_build_lib(package_dir: Path) -> Path:
    """<checkout>/build/lib for the package folder <checkout>/python/mall: the libraries of the
    source checkout's default build folder, where libmall and mall.tensorflow's op library are
    looked for last."""
    return package_dir.parent.parent / "build" / "lib"


def candidate_paths() -> list[str]:
    """Where libmall is looked for, in order (see the module docstring of mall)."""
    candidates: list[str] = []
    from_env = os.environ.get("MALL_LIBRARY")
    if from_env:
        candidates.append(from_env)
    package_dir = Path(__file__).resolve().parent
    # Installed layout: `cmake --install` and `pip install` write _install_paths.py with the library
    # folder relative to this package (and as an absolute path, for a relocated prefix).
    try:
        from . import _install_paths  # type: ignore[attr-defined]
    except ImportError:
        _install_paths = None
    if _install_paths is not None:
        # An empty entry is no folder (never the working directory).
        folders = []
        if _install_paths.LIBRARY_DIR_RELATIVE:
            folders.append(Path(os.path.normpath(package_dir / _install_paths.LIBRARY_DIR_RELATIVE)))
        if _install_paths.LIBRARY_DIR_ABSOLUTE:
            folders.append(Path(_install_paths.LIBRARY_DIR_ABSOLUTE))
        for folder in folders:
            candidates.extend(str(folder / name) for name in _LIBRARY_NAMES)
    found = ctypes.util.find_library("mall")
    if found:
        candidates.append(found)
    # A source checkout next to its default build folder.
    candidates.extend(str(checkout_build_lib(package_dir) / name) for name in _LIBRARY_NAMES)
    return candidates


def load(path: str | os.PathLike | None = None) -> _Api:
    """Loads libmall from `path`, or from the first candidate that exists and loads."""
    tried: list[str] = []
    paths = [os.fspath(path)] if path is not None else candidate_paths()
    for candidate in paths:
        if candidate in _loaded:
            return _loaded[candidate]
        # A bare soname (from find_library) is resolved by the runtime loader; a path must exist.
        if os.sep in candidate and not os.path.exists(candidate):
            tried.append(f"{candidate} (missing)")
            continue
        try:
            api = _Api(candidate)
        except (OSError, AttributeError) as exc:
            tried.append(f"{candidate} ({exc})")
            continue
        if api.version // 10000 != EXPECTED_API_MAJOR or api.version < MINIMUM_API_VERSION:
            raise MallError(
                MALL_ERR_VERSION,
                f"{candidate} has API version {version_text(api.version)}; this module needs "
                f"{EXPECTED_API_MAJOR}.x from {version_text(MINIMUM_API_VERSION)} on",
            )
        _loaded[candidate] = api
        return api
    raise MallError(
        MALL_ERR_SYSTEM,
        "cannot load libmall (tried: " + "; ".join(tried or ["nothing"]) + "); "
        "set MALL_LIBRARY to the path of libmall.so.0",
    )
