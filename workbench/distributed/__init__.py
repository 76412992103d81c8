"""What every mechanism that runs on several processes shares, knowing no mechanism: devices emulated by real
CPU limits (:mod:`workbench.distributed.cpulimit`). Worker processes are :mod:`workbench.workers`."""
