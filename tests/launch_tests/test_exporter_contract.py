"""The contract every registered export format keeps, one suite run over :func:`launch.exporters.exporters`
(Optuna's ``StorageTestCase`` pattern): a format added as one module and one ``register_exporter`` line
passes it with no other edit. A main-job format renders the seed layout (a recipe against its schema),
writes the pipeline layout string that gives back the layout's split, and a script passes ``bash -n``; an
RL format renders an RL plan it can run and refuses a training layout; every format is named where
``--format`` is refused."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml
from rl_tests.test_rl_export import seed_plan

from cost_model.estimate import estimate
from launch.exporters import ExportContext, Exporter, exporters, get_exporter, validate_recipe
from rl.engine import Engine
from rl.exporters import plan_context  # registers the RL formats, so the suite runs over them too
from rl.plan import Framework
from rl.trainer import TrainerBackend
from search_spaces.pipeline import layer_counts_from_string, stage_layer_counts
from specs import Workload, load_model, parse_gpus
from specs.errors import TunerError

WL = Workload(seq_length=8192, global_batch_size=128)
#: RL plans of each framework (its engine and trainer): an RL format renders at least one of them.
RL_PLANS = ({}, dict(engine=Engine.sglang, framework=Framework.slime, backend=TrainerBackend.megatron))


def _values(doc, key):
    """Every value of ``key`` in a loaded YAML document, at any depth."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key:
                yield v
            yield from _values(v, key)
    elif isinstance(doc, list):
        for v in doc:
            yield from _values(v, key)


@pytest.fixture(scope="module")
def training(seed_tuned):
    m, c = load_model("MiniMax-M2"), parse_gpus("64xH200")
    return ExportContext(
        model=m, cluster=c, workload=WL, layout=seed_tuned, estimate=estimate(m, c, WL, seed_tuned), study="s"
    )


@pytest.fixture(params=list(exporters().values()), ids=lambda e: e.name)
def exporter(request) -> Exporter:
    return request.param


def test_it_is_registered_under_its_name_and_refusals_list_it(exporter):
    assert get_exporter(exporter.name) is exporter
    assert (
        exporter.file_name
        and "/" not in exporter.file_name
        and exporter.description
        and "\n" not in exporter.description
    )
    with pytest.raises(TunerError, match=re.escape(exporter.name)):
        get_exporter("not-a-format")


def test_it_renders_its_context_and_the_pipeline_string_round_trips(exporter, training, tmp_path):
    if not exporter.main_job:
        with pytest.raises(TunerError):
            exporter.render(training)  # an RL format refuses a training layout's context
        texts = []
        for kw in RL_PLANS:
            try:
                texts.append(exporter.render(plan_context(*seed_plan(**kw))))
            except TunerError:  # a plan of another framework
                pass
        assert texts and all(t.strip() and t.endswith("\n") and not t.endswith("\n\n") for t in texts)
        return
    path = exporter.write(training, tmp_path / exporter.file_name)
    text = path.read_text()
    assert text.endswith("\n") and not text.endswith("\n\n")  # one final newline: a tool reading lines gets the last
    lay = training.layout
    if exporter.file_name.endswith(".yaml"):
        rec = yaml.safe_load(text)
        if "schema_version" in rec:  # a recipe
            validate_recipe(rec)
        (written,) = set(_values(rec, "pipeline_model_parallel_layout"))
    else:
        (written,) = {shlex.split(m)[0] for m in re.findall(r"--pipeline-model-parallel-layout\s+('[^']*'|\S+)", text)}
    n = training.model.num_layers
    assert layer_counts_from_string(written, lay.pp, n) == stage_layer_counts(
        n, lay.pp, lay.vpp, lay.num_layers_in_first_pipeline_stage, lay.num_layers_in_last_pipeline_stage
    )
    if exporter.executable or path.suffix == ".sh":
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        assert bool(path.stat().st_mode & 0o100) == exporter.executable
