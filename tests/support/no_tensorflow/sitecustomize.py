"""A Python without TensorFlow, in the project's own environment: put this folder first on
PYTHONPATH and `tensorflow` and `tf_keras` are not found, as where they were never installed
(`importlib.util.find_spec` says None, `import tensorflow` raises ModuleNotFoundError,
transformers' `is_tf_available()` is False).

    env = payload_env(PYTHONPATH=f"{NO_TENSORFLOW}:{REPO}")   # tests.support.paths

Python imports `sitecustomize` at start-up; this one hides the packages from the finder of
installed packages (PathFinder) rather than raising from a finder of its own, which would make
`find_spec` raise where a real absence answers None.
"""

import sys
from importlib.machinery import PathFinder

HIDDEN = ("tensorflow", "tf_keras")


class _WithoutTensorFlow(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return PathFinder.find_spec(fullname, path, target)


sys.meta_path[:] = [_WithoutTensorFlow if finder is PathFinder else finder
                    for finder in sys.meta_path]
