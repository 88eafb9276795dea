"""Where the deploy package ``ppdlx_deploy`` comes from: deploy/ does not import ppdlx, and ppdlx does not
depend on deploy/, so the benchmarks, ``--verify`` and the tests find it at run time."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Optional

from ppdlx.errors import ConfigError

DEPLOY_PACKAGE = "ppdlx_deploy"
DEPLOY_DIR_ENV = "PPDLX_DEPLOY_DIR"
# deploy/python of this checkout (a test points it elsewhere to play an installed wheel).
CHECKOUT_DEPLOY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy", "python")


def _package_dir_in(directory: str) -> Optional[str]:
    """The ppdlx_deploy package under ``directory`` (deploy/python, or a checkout's deploy/)."""
    for candidate in (os.path.join(directory, DEPLOY_PACKAGE), os.path.join(directory, "python", DEPLOY_PACKAGE)):
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def find_deploy_dir(deploy_dir: Optional[str] = None) -> Optional[str]:
    """The folder of the ``ppdlx_deploy`` package to use: ``deploy_dir`` (``--deploy-dir``), else
    ``$PPDLX_DEPLOY_DIR``, else this checkout's deploy/python; None when none is given and the
    checkout has none, so that an installed ``ppdlx_deploy`` is used. A folder given but holding
    no package is a one-line ConfigError."""
    for given, origin in ((deploy_dir, "--deploy-dir"), (os.environ.get(DEPLOY_DIR_ENV), DEPLOY_DIR_ENV)):
        if given:
            package_dir = _package_dir_in(given)
            if package_dir is None:
                raise ConfigError(f"{origin}={given}: no {DEPLOY_PACKAGE}/ package there (expected "
                                  f"{os.path.join(given, DEPLOY_PACKAGE, '__init__.py')}); point it at deploy/python "
                                  f"of a ppdlx checkout")
            return package_dir
    return _package_dir_in(CHECKOUT_DEPLOY_DIR)


def load_deploy_module(deploy_dir: Optional[str] = None):
    """The deploy package ``ppdlx_deploy`` (its public API: load_meta, Pipeline, PaddlePredictor,
    ...), imported from :func:`find_deploy_dir`'s folder or, without one, as installed. Cached in
    sys.modules; asking for a second copy from another folder in the same process is refused."""
    package_dir = find_deploy_dir(deploy_dir)
    loaded = sys.modules.get(DEPLOY_PACKAGE)
    if loaded is not None:
        loaded_dir = os.path.dirname(os.path.abspath(loaded.__file__))
        if package_dir is not None and os.path.realpath(loaded_dir) != os.path.realpath(package_dir):
            raise ConfigError(f"{DEPLOY_PACKAGE} is already imported from {loaded_dir} in this process; "
                              f"cannot also load {package_dir}")
        return loaded
    if package_dir is None:
        if importlib.util.find_spec(DEPLOY_PACKAGE) is None:
            raise ConfigError(f"the deploy package {DEPLOY_PACKAGE} was not found: not in {CHECKOUT_DEPLOY_DIR} "
                              f"and not installed; pass --deploy-dir or set {DEPLOY_DIR_ENV} to deploy/python of "
                              f"a ppdlx checkout")
        return importlib.import_module(DEPLOY_PACKAGE)
    spec = importlib.util.spec_from_file_location(DEPLOY_PACKAGE, os.path.join(package_dir, "__init__.py"),
                                                  submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[DEPLOY_PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for name in [n for n in sys.modules if n == DEPLOY_PACKAGE or n.startswith(DEPLOY_PACKAGE + ".")]:
            del sys.modules[name]
        raise
    return module
