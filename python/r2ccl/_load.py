"""Load the UCX libraries the extension module links against, before importing it."""

import ctypes
import os


def load_ucx() -> None:
    """Make UCX's shared libraries resolvable for ``r2ccl._r2ccl``.

    Order: ``R2CCL_UCX_DIR`` (its ``lib/``), then the ``libucx-cu13`` wheel (a dependency of
    this package), then the system's loader path. A library loaded here by path satisfies the
    extension's ``libucp.so.0``-style dependencies by soname.
    """
    names = ["libucs.so", "libuct.so", "libucp.so"]
    root = os.environ.get("R2CCL_UCX_DIR")
    if root:
        for name in names:
            path = os.path.join(root, "lib", name)
            if os.path.exists(path):
                ctypes.CDLL(path, ctypes.RTLD_GLOBAL)
        return
    try:
        import libucx  # type: ignore[import-not-found]
    except ImportError:
        return  # the system's UCX, found by the dynamic loader
    libucx.load_library()
