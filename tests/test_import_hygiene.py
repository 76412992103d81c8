import subprocess
import sys

ENGINE = ["workbench", "workbench.bitpack", "workbench.cache", "workbench.data", "workbench.devices",
          "workbench.timeline", "workbench.prepare", "workbench.cli", "workbench.elastic.finetune",
          "workbench.models.encoder", "workbench.models.decoder", "workbench.bench"]


def test_engine_imports_load_no_ui_library():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in ENGINE) +
            "bad = sorted(m for m in ('plotly', 'ipywidgets', 'anywidget', 'voila') if m in sys.modules)\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
