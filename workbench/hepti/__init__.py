"""Hepti (heterogeneous partitioning) as the gallery lists it: a page of its own.

Its engine is part of :mod:`workbench.partition` (the cost model, the LP and the runtime it shares with
Voltage); this package holds only its declaration (:mod:`workbench.hepti.mechanism`), so that the registry's
rule, one mechanism per package named after it, holds, and its views (``workbench.ui.hepti``,
``workbench.viz.hepti``) are its own.
"""
