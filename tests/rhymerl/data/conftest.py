"""Lets `rhymerl.data.<module>` import while the flat module rhymerl/data.py still stands beside
the rhymerl/data/ folder (a module shadows a folder without __init__.py). Once rhymerl/data/ is a
package this does nothing; delete the file then."""

import importlib
from pathlib import Path

_data = importlib.import_module("rhymerl.data")
if not hasattr(_data, "__path__"):
    _data.__path__ = [str(Path(_data.__file__).with_suffix(""))]
