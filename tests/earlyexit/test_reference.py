"""The E3 paper's figures ship as a CSV that loads with its columns and holds the numbers as the paper prints them."""
import pytest

from workbench.earlyexit import reference


def test_the_csv_loads_with_its_columns_and_every_row_names_its_source():
    rows = reference.paper_figures()
    assert tuple(rows.columns) == reference.COLUMNS
    assert len(rows) >= 30 and (rows["metric"] != "").all() and (rows["value"] != "").all()
    assert set(rows["figure"]) >= {"7", "8", "13", "20", "22", "25", "text"}
    assert (rows["section"] != "").all()


def test_a_few_values_as_the_paper_states_them():
    assert reference.paper_value("goodput gain over the early-exit model", "BERT-BASE (DeeBERT) on 16 V100") == "1.44"
    assert reference.paper_value("goodput gain over the early-exit model", "ResNet-50 (BranchyNet) on 16 V100") == "1.74"
    assert reference.paper_range("goodput lost to a batch profile misprediction",
                                 "20% error (Llama-3.1-8B set-up)") == (4.0, 8.0)
    assert reference.paper_range("goodput gained by disabling ramps inside splits",
                                 "exit wrapper (section 3.4)") == (16.0, 16.0)
    assert reference.paper_range("goodput against the stock model with mostly hard inputs", "20:80 mix") == (-23.0, -23.0)
    assert reference.paper_value("default exit entropy", "") == "0.4"


def test_the_optimizer_times_of_figure_20():
    times = reference.optimizer_times()
    assert len(times) == 6 and set(times["cluster"]) == {"homogeneous", "heterogeneous"}
    assert times["paper_s"].min() == 0.87 and times["paper_s"].max() == 3.63
    bert = times[times["model"] == "bert-base"].set_index("cluster")["paper_s"]
    assert bert["homogeneous"] == 0.87 and bert["heterogeneous"] == 2.09


def test_gains_are_factors_and_unknown_figures_are_refused():
    gains = reference.gains()
    assert gains["value"].max() == 3.8 and (gains["value"] > 1).all()
    with pytest.raises(KeyError, match="no E3 figure"):
        reference.paper_value("goodput", "nowhere")
    with pytest.raises(ValueError, match="in words"):
        reference.paper_range("batch profile forecast", "two cuts over 10 two-minute windows at input batch 8")
