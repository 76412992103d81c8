"""What every mechanism that runs on several processes shares, knowing no mechanism: a group of worker ranks
and their job loop (:mod:`~workbench.distributed.ranks`, :mod:`~workbench.distributed.worker`), devices emulated
by real CPU limits (:mod:`~workbench.distributed.cpulimit`), links shaped by ``tc`` in network namespaces
(:mod:`~workbench.distributed.shaping`), the arrays on the wire (:mod:`~workbench.distributed.wire`), what a rank
walks with (counted collectives, its clock, :mod:`~workbench.distributed.execute`), a schedule of steps and its
predicted timeline (:mod:`~workbench.distributed.steps`), share vectors and device tables
(:mod:`~workbench.distributed.shares`) and the ranges of their numbers (:mod:`~workbench.distributed.limits`).
Worker processes themselves are :mod:`workbench.workers`; a mechanism's runtime subclasses
:class:`~workbench.distributed.ranks.RankGroup` (Voltage's ``workbench.partition.runtime``, Hepti's
``workbench.hepti.run.HeptiGroup``)."""
