"""The one thing pyproject.toml cannot say: with MEGATRAIN_BUNDLE_LIBRARY set
to a libmegatrain.so.0, the build copies it into the package, which then
loads it before any other (megatrain/_lib.py), and the wheel is marked for
this platform since it carries machine code. Without it the package is pure
Python and finds the installed library."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

BUNDLE = os.environ.get("MEGATRAIN_BUNDLE_LIBRARY")


class BuildPy(build_py):
    def run(self):
        super().run()
        if BUNDLE:
            target = os.path.join(self.build_lib, "megatrain", "libmegatrain.so.0")
            shutil.copyfile(os.path.realpath(BUNDLE), target)
            os.chmod(target, 0o755)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return bool(BUNDLE)


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
