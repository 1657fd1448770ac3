"""Which exactjit package the Python tests import, and the environment of the Pythons they start.

By default the checkout's python/exactjit (ctest sets EXACTJIT_LIBRARY to the build's library).
With EXACTJIT_TEST_INSTALLED=1 the installed package (the wheel in site-packages): the checkout
stays off sys.path, in this process and in every child, so a pass says the wheel works.
Importing this module puts the chosen package first on sys.path."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED = os.environ.get("EXACTJIT_TEST_INSTALLED") == "1"
_CHECKOUT_PACKAGE = os.path.join(REPO, "python")

if not INSTALLED:
    sys.path.insert(0, _CHECKOUT_PACKAGE)


def child_env(**overrides):
    """os.environ plus `overrides`, for a child Python that imports the same package."""
    env = dict(os.environ, **overrides)
    if not INSTALLED:
        env["PYTHONPATH"] = _CHECKOUT_PACKAGE
    return env
