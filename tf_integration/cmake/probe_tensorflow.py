# SPDX-License-Identifier: BSD-3-Clause
"""probe_tensorflow.py — tells CMake about the TensorFlow the running Python imports, for building
mall's op library (libmall_tf_ops.so) against it. Run by tf_integration/cmake/tensorflow.cmake as
`python -I probe_tensorflow.py [--flags]` (-I: under pip's isolated build it still sees the
user's own site-packages, where their TensorFlow is).

Prints `key=value` lines and exits 0: found=yes|no, package_dir, distribution, version; with --flags
also (importing TensorFlow, a few seconds) include_dir, library_dir, framework_library and
compile_definitions (the -D flags of tf.sysconfig.get_compile_flags(), ';'-separated). Prints
found=no, with why=..., when TensorFlow cannot be found or imported; never raises.
"""

import importlib.metadata
import importlib.util
import os
import sys


def main() -> int:
    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError) as exc:
        spec = None
        print(f"why=finding tensorflow failed: {exc}")
    if spec is None or not spec.submodule_search_locations:
        print("found=no")
        print(f"why=no tensorflow module for {sys.executable}")
        return 0
    package_dir = list(spec.submodule_search_locations)[0]
    # The distribution that installed the module: tensorflow, tensorflow-cpu, tf-nightly, ...
    names = importlib.metadata.packages_distributions().get("tensorflow", [])
    names = sorted(set(names), key=lambda n: (not n.lower().startswith("tensorflow"), n))
    distribution = names[0] if names else ""
    version = importlib.metadata.version(distribution) if distribution else ""
    if "--flags" not in sys.argv[1:]:
        print("found=yes")
        print(f"package_dir={package_dir}")
        print(f"distribution={distribution}")
        print(f"version={version}")
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf  # noqa: PLC0415 (the import is the point of --flags)

        flags = tf.sysconfig.get_compile_flags()
        include_dir = tf.sysconfig.get_include()
        library_dir = tf.sysconfig.get_lib()
        version = tf.__version__
    except Exception as exc:  # noqa: BLE001 (any failure means: no usable TensorFlow)
        print("found=no")
        print(f"why=importing tensorflow from {package_dir} failed: {type(exc).__name__}: {exc}")
        return 0
    framework = ""
    for name in ("libtensorflow_framework.so.2", "libtensorflow_framework.so"):
        if os.path.isfile(os.path.join(library_dir, name)):
            framework = os.path.join(library_dir, name)
            break
    print("found=yes")
    print(f"package_dir={package_dir}")
    print(f"distribution={distribution}")
    print(f"version={version}")
    print(f"include_dir={include_dir}")
    print(f"library_dir={library_dir}")
    print(f"framework_library={framework}")
    print("compile_definitions=" + ";".join(f[2:] for f in flags if f.startswith("-D")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
