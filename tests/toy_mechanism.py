"""A small mechanism declared by the tests: a prepare step, a command, a page with its panel, a benchmark, an
overview section, an info section and test artifacts. Added to ``REGISTERED`` by ``tests/test_mechanisms.py``, it
must show in every shared page and command with no line of shared code changed."""
from __future__ import annotations

import ipywidgets as widgets

from workbench.argtypes import Parser
from workbench.mechanisms import Command, Dashboard, InfoSection, Mechanism, OverviewSection, PrepareStep
from workbench.ui.base import Panel
from workbench.viz.style import message_figure

STEP = "toy step"
RAN: list = []
READY = {"toy step": True}


def _configure(parser) -> None:
    parser.add_argument("--x", type=int, default=1)
    parser.set_defaults(func=lambda args: RAN.append(args.x) or 0)


def parser() -> Parser:
    p = Parser(prog="workbench bench toy")
    p.add_argument("--rows", type=int, default=2)
    return p


def run(args: list[str]) -> list[dict]:
    return [{"row": k, "toy_ms": 1.5 * k} for k in range(parser().parse_args(args).rows)]


class ToyPanel(Panel):
    """One slider and one figure titled with its value."""

    dashboard_page = "toy.ipynb"
    redraws = 0

    def __init__(self, preset: str | None = None):
        super().__init__()
        self.knob = widgets.IntSlider(value=0, min=0, max=9, description="Toy knob", continuous_update=False)
        self.observe_controls(self.knob)
        self.children = [widgets.HTML("<span class='wb-toy'>toy page</span>"), self.knob, self.message,
                         self.figure_slot("toy")]
        self.refresh()

    def _refresh(self) -> None:
        type(self).redraws += 1
        self.show_figure("toy", message_figure(f"toy at {self.knob.value}", "a figure of the toy mechanism"))


class ToyOverview(widgets.HTML):
    def __init__(self, preset: str):
        super().__init__(f"<span class='wb-toy-overview'>toy artifacts of the {preset} preset</span>")


MECHANISM = Mechanism(
    name="toy", title="Toy mechanism", paper="the tests' own",
    prepare_steps=lambda preset: [PrepareStep(name=STEP, run=lambda preset, progress, force: RAN.append(preset) or "made",
                                              ready=lambda preset: READY[STEP])],
    commands=(Command(name="go", help="go somewhere", configure=_configure),),
    benchmarks={"toy": __name__},
    dashboard=Dashboard(page="toy.ipynb", title="Toy page", summary="one toy line", requires=(STEP,),
                        probe_control="Toy knob", probe_figure="toy", panel=f"{__name__}:ToyPanel"),
    info=lambda preset: InfoSection(data={"toy_preset": preset}, lines=(f"toy made for {preset}",)),
    overview=OverviewSection(title="Toy section", panel=f"{__name__}:ToyOverview", requires=(STEP,)),
    test_artifacts=lambda preset: {"toy": f"toy artifact ({preset})"},
)
