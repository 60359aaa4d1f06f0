"""Where the plugin author kit is: the folder holding npubridgeConfig.cmake
(for find_package(npubridge)) and the include folder holding
npubridge/plugin_api.h, npubridge/plugin_sdk.hpp and dlpack/dlpack.h.

In the wheel both sit inside the package (npubridge/lib/cmake/npubridge,
npubridge/include); in a build tree, whose package is staged to
<build>/python/npubridge, they are <build>/lib/cmake/npubridge and
<build>/include (the top CMakeLists.txt's install section).
"""
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CONFIG = Path("lib", "cmake", "npubridge", "npubridgeConfig.cmake")


def _kit_root() -> Path:
    candidates = (_PACKAGE, _PACKAGE.parent.parent)  # the wheel, the build tree
    for root in candidates:
        if (root / _CONFIG).is_file():
            return root
    raise FileNotFoundError(
        f"npubridge: no {_CONFIG} in {' or '.join(str(c) for c in candidates)}: this npubridge "
        "is neither an installed wheel nor a build tree")


def cmake_dir() -> str:
    """The folder holding npubridgeConfig.cmake: pass it as CMAKE_PREFIX_PATH or npubridge_DIR."""
    return str(_kit_root() / _CONFIG.parent)


def include_dir() -> str:
    """The folder holding npubridge/plugin_api.h (and dlpack/dlpack.h)."""
    return str(_kit_root() / "include")
