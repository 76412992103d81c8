"""The ranges of the E3 slice's numbers, each with what bounds it. The commands' options (argparse types) and
the Python API (``Number.check``) read the same ones, so a value is refused in the same words wherever it is
given (``workbench.argtypes``)."""
from __future__ import annotations

from workbench.argtypes import Bound, Number, count, non_negative, positive

slo_ms = positive("ms", Bound(60_000, "a minute: beyond it nothing is served interactively"))
batch = count(at_most=Bound(64, "the largest batch the layer profiles cover"), unit="samples")
threshold = non_negative("nats", Bound(10.0, "more than the entropy of any of the tasks' predictions"))
rate = positive("requests/s", Bound(1e6, "a million requests per second"))
requests = count(at_most=Bound(200_000, "a simulation of minutes at most"), unit="requests")
slack = Number("", minimum=0, at_most=Bound(0.99, "a slack of the whole SLO leaves no time to serve"), whole=False)
easy_share = Number("", minimum=0, at_most=Bound(1.0, "all inputs easy; 80:20 is 0.8"), whole=False)
workload_requests = count(at_most=Bound(1_000_000, "the requests of one workload drawn at once"), unit="requests")
windows = count(at_most=Bound(10_000, "a forecast series of hours of windows"), unit="windows")
replica_count = count(at_most=Bound(16, "CPU replicas of a quarter core each: 4 per core on a 4-core machine"),
                      unit="replicas")


def check_easy_share(easy) -> float:
    """``easy`` as a float if it is an easy share of a mix (0 to 1), else ``OutOfRangeError`` saying so."""
    return float(easy_share.check("the easy share of a mix", easy))
