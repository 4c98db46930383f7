"""The run directory's readers of a run's own files (`read_config`, `read_summary`,
`read_metrics`, `metric_columns`): one shape each, damage as one `FedhetError` line."""

from __future__ import annotations

import math

import pytest

from fedhet.errors import FedhetError
from fedhet.rundir import metric_columns, read_config, read_metrics, read_summary


def test_read_metrics_gives_one_float_row_per_round_with_blank_cells_nan(tmp_path):
    (tmp_path / "metrics.csv").write_text("round,test_accuracy,cum_bytes\n0,0.1,\n1,0.25,400\n")
    rows = read_metrics(tmp_path)
    assert rows[1] == {"round": 1.0, "test_accuracy": 0.25, "cum_bytes": 400.0}
    assert rows[0]["round"] == 0.0 and math.isnan(rows[0]["cum_bytes"])
    assert read_metrics(tmp_path / "metrics.csv") == rows  # the file or its directory


def test_metric_columns_are_the_union_of_the_rows_columns_in_order():
    columns = metric_columns([{"round": 0.0, "a": 1.0}, {"round": 1.0, "b": 2.0}])
    assert list(columns) == ["round", "a", "b"]
    assert columns["round"] == [0.0, 1.0] and columns["a"][0] == 1.0 and math.isnan(columns["a"][1])
    assert math.isnan(columns["b"][0]) and columns["b"][1] == 2.0
    assert metric_columns([]) == {}


def test_a_run_without_metrics_has_no_rows_only_when_asked(tmp_path):
    assert read_metrics(tmp_path, missing_ok=True) == []
    with pytest.raises(FedhetError, match="metrics.csv is missing"):
        read_metrics(tmp_path)


def test_read_summary_and_config_read_the_json_object_and_name_damage_in_one_line(tmp_path):
    assert read_summary(tmp_path, missing_ok=True) == {}
    with pytest.raises(FedhetError, match="summary.json is missing"):
        read_summary(tmp_path)
    with pytest.raises(FedhetError, match="has no config.json: it is not a fedhet run directory"):
        read_config(tmp_path)
    (tmp_path / "summary.json").write_text('{"rounds_done": 3, "finished": true}')
    (tmp_path / "config.json").write_text('["not", "an", "object"]')
    assert read_summary(tmp_path) == {"rounds_done": 3, "finished": True}
    with pytest.raises(FedhetError, match=r"config.json holds a JSON list \(\[...\]\) where fedhet "
                                          r"writes a JSON object") as raised:
        read_config(tmp_path)
    assert "\n" not in str(raised.value)
