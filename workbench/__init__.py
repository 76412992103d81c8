"""Workbench: study and steer efficient transformer inference on edge devices.

The engine (models, devices, timeline, elastic, ...) is pure Python/NumPy/torch;
`workbench.viz` builds Plotly figures and `workbench.ui` wires ipywidgets to them.
Importing this package loads neither plotly nor ipywidgets.
"""
from workbench.errors import WorkbenchError

__version__ = "0.1.0"
__all__ = ["WorkbenchError", "__version__"]
