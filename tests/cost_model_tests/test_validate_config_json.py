"""``tune validate``: a row's model column may be a Hugging Face ``config.json`` path (the user's own model)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from cost_model.validate import read_runs

ROOT = Path(__file__).resolve().parents[2]


def test_a_config_json_in_the_model_column_is_read_from_the_tables_folder(tmp_path):
    with (ROOT / "benchmarks/data/published_runs.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r["id"] == "102"]  # Llama-3.1-70B (SFT, 32 x H100)
        fields = reader.fieldnames
    (tmp_path / "m").mkdir()
    shutil.copy(ROOT / "specs/data/models/Llama-3.1-70B.json", tmp_path / "m/config.json")
    mine = dict(rows[0], model="m/config.json")
    broken = dict(rows[0], id="x", model="nowhere/config.json")
    with (tmp_path / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows([mine, broken])
    runs = {r.run_id: r for r in read_runs(tmp_path / "runs.csv")[0]}
    assert runs["102"].model is not None and runs["102"].model.num_layers == 80 and not runs["102"].unrepresentable
    assert runs["x"].model is None and "nowhere/config.json" in runs["x"].unrepresentable
