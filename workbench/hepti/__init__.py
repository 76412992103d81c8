"""Hepti: transformer inference split over unequal edge devices, in one of three weight-stationary modes.

- :mod:`~workbench.hepti.plan`: the cost model (Eqs. 5-7), the memory each mode holds, and P2 as a mixed-integer
  program (:func:`hepti_partition`, :class:`Partition`); pure Python.
- :mod:`~workbench.hepti.run`: the layer-by-layer decisions (memory reports, speed re-estimation) and
  :func:`run_hepti`, the request on one process per device (:class:`~workbench.hepti.run.HeptiGroup` of
  :mod:`~workbench.hepti.worker` ranks walking :mod:`~workbench.hepti.execute`, each holding only its slice of
  the weights, :mod:`~workbench.hepti.weights`).
- :mod:`~workbench.hepti.scenario`: a study's settings (:class:`~workbench.hepti.scenario.Scenario`) turned into
  every layer's decision, the executed steps and the comparison with the baselines' shares, as the page shows them.
- :mod:`~workbench.hepti.evaluation`: the evaluation notebook's tables; :mod:`~workbench.hepti.lab`,
  :mod:`~workbench.hepti.bench`, :mod:`~workbench.hepti.commands` (``workbench hepti plan|run``).

It shares the distributed runtime (:mod:`workbench.distributed`), the network model (:mod:`workbench.network`)
and the models (:mod:`workbench.models`) with Voltage, and imports nothing of it.
"""
from workbench.lazy import lazy_exports

_EXPORTS = {
    "hepti_partition": "plan", "Partition": "plan", "MODES": "plan", "MODE_TITLES": "plan",
    "run_hepti": "run", "HeptiRun": "run", "PrimaryLost": "run", "HeptiGroup": "run",
    "Scenario": "scenario", "schedule": "scenario", "LayerDecision": "scenario",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
