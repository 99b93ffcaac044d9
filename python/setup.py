"""The wheel carries libckptkit.so, a native library loaded with ctypes (no
Python extension module), so it is built for a platform but for any Python
3: tag py3-none-<platform>, never none-any. Everything else is in
pyproject.toml."""

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """bdist_wheel with a platform tag and an interpreter-independent ABI."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False  # the library is platform code

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"bdist_wheel": PlatformWheel})
