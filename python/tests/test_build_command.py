# SPDX-License-Identifier: BSD-3-Clause
"""test_build_command.py — mall.tensorflow names the one command that builds the op library, as the
package was installed (issue 38, the Debian package and Keras users).

A `cmake --install` (the Debian package too) carries the Python package's sdist under
<datadir>/mall/python and records it as _install_paths.SOURCE: its mall.tensorflow must name
`python -m pip install ... <that sdist>`, which a user runs in their TensorFlow venv, not a cmake
build folder the node's users never had. Without that file it names the cmake commands; a pip
install names pip with the source it came from. Run by ctest (label unit) with PYTHONPATH=python/;
TensorFlow is not needed (mall.tensorflow imports it only to load the op library).
"""

import os
import sys
import tempfile
import types
import unittest
from unittest import mock

import mall
import mall.tensorflow


def facts(installer: str, source: str) -> types.ModuleType:
    module = types.ModuleType("mall._install_paths")
    module.LIBRARY_DIR_RELATIVE = ""
    module.LIBRARY_DIR_ABSOLUTE = "/usr/lib/x86_64-linux-gnu"
    module.INSTALLER = installer
    module.SOURCE = source
    module.OP_LIBRARY = "not built"
    return module


class BuildCommand(unittest.TestCase):
    def command_for(self, installer: str, source: str) -> str:
        module = facts(installer, source)
        with mock.patch.dict(sys.modules, {"mall._install_paths": module}), \
                mock.patch.object(mall, "_install_paths", module, create=True):
            return mall.tensorflow.build_command()

    def test_a_cmake_install_with_its_sdist_names_pip_install_of_the_sdist(self):
        with tempfile.TemporaryDirectory() as folder:
            sdist = os.path.join(folder, "mall-0.3.0.tar.gz")
            open(sdist, "wb").close()
            self.assertEqual(self.command_for("cmake", sdist),
                             f"{sys.executable} -m pip install --force-reinstall --no-deps --no-cache-dir {sdist}")

    def test_a_cmake_install_whose_sdist_is_gone_names_the_cmake_build(self):
        command = self.command_for("cmake", "/nonexistent/mall-0.3.0.tar.gz")
        self.assertTrue(command.startswith(f"cmake -DMALL_TENSORFLOW_PYTHON={sys.executable} "), command)
        self.assertNotIn("/nonexistent", command)

    def test_a_cmake_install_without_an_sdist_names_the_cmake_build(self):
        self.assertTrue(self.command_for("cmake", "").startswith("cmake -DMALL_TENSORFLOW_PYTHON="))

    def test_a_pip_install_names_pip_with_its_source(self):
        with tempfile.TemporaryDirectory() as folder:
            self.assertEqual(self.command_for("pip", folder),
                             f"{sys.executable} -m pip install --force-reinstall --no-deps --no-cache-dir {folder}")

    def test_the_missing_op_library_error_names_the_command(self):
        with tempfile.TemporaryDirectory() as folder:
            sdist = os.path.join(folder, "mall-0.3.0.tar.gz")
            open(sdist, "wb").close()
            module = facts("cmake", sdist)
            with mock.patch.dict(sys.modules, {"mall._install_paths": module}), \
                    mock.patch.object(mall, "_install_paths", module, create=True), \
                    mock.patch.dict(os.environ, {"MALL_TF_OPS_LIBRARY": os.path.join(folder, "none.so")}), \
                    mock.patch.object(mall.tensorflow, "__file__", os.path.join(folder, "mall", "tensorflow.py")):
                with self.assertRaises(mall.MallError) as raised:
                    mall.tensorflow.op_library_path()
            self.assertIn(f"-m pip install --force-reinstall --no-deps --no-cache-dir {sdist}", str(raised.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
