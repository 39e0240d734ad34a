"""The Python tests import the package from this source tree (python/) and
the library named by ZEPPELIN_LIBRARY (ctest sets it to the build's)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
