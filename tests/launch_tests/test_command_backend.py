"""What is the command backend's own: launch templates, Megatron log parsing, its trial files and messages (no GPU,
no torch; the fake trial program prints Megatron's log). What every backend does (a measurement, OOM, crash,
timeout, a stop, cancel) is in test_backend_contract.py."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from flag_parsing import argv_flags

from launch import BackendSettings, get_backend
from launch.base import FailureKind, TrialFailed
from launch.command_backend import SLIME_TEMPLATE, CommandBackend, load_template
from launch.exporters._flags import layout_args, model_args
from launch.megatron_log import MegatronLogReader, parse_megatron_log
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = FIXTURES / "megatron_logs"
FAKE = str(Path(__file__).with_name("fake_trial.py"))
MIB = 2**20
WL = Workload(seq_length=8192, global_batch_size=8)


@pytest.fixture(scope="module")
def m4():
    return slice_model(load_model("MiniMax-M2"), 4)


def _tpl(tmp_path: Path, doc: dict | str, name: str = "t.yaml") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


def _megatron(mode: str = "ok", step_ms: float = 100.0, *more: str) -> list[str]:
    """The fake trial program printing Megatron's log: ``{steps}`` iterations of ``step_ms`` each (without waiting)."""
    return [
        sys.executable, FAKE, "--FAKE_FORMAT=megatron", "--FAKE_STEPS={steps}", f"--FAKE_TRIAL_MODE={mode}",
        "--FAKE_STEP_S=0", f"--FAKE_REPORT_STEP_S={step_ms / 1000}", *more,
    ]


def _fake(tmp_path: Path, mode: str, iters: int = 6, step_ms: float = 100.0, **extra) -> CommandBackend:
    doc = {"argv": _megatron(mode, step_ms), **extra}
    return CommandBackend(command_template=_tpl(tmp_path, doc), trials_dir=tmp_path / "trials", steps=iters,
                          warmup_steps=2, timeout_s=20, poll_s=0.02)  # fmt: skip


def _run(b, m4, lay=None, **kw):
    return b.run(lay or Layout(world_size=4, ep=4), model=m4, cluster=parse_gpus("4xH200"), workload=WL, **kw)


# --------------------------------------------------------------------------- templates


def test_placeholders_are_substituted_per_element_and_never_through_a_shell(tmp_path, m4, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("EVIL", "x; rm -rf / $(touch pwned) `id` \"'")
    literal = [
        "--tp={tp}", "{pp}", "{ep}", "{etp}", "{dp}", "{env:EVIL}", "a b;c", "$(echo hi)", "{{literal}}",
        "{world_size}x{gpus_per_node}", "{steps}",
    ]
    tpl = load_template(_tpl(tmp_path, {
        "argv": [*_megatron("ok", 1.0, f"--FAKE_ENV_DUMP={dump}"), *literal],
        "env": {"FAKE_EXTRA": "{env:EVIL}|{seq_length}", "NCCL_NVLS_ENABLE": "1"},
    }))  # fmt: skip
    b = CommandBackend(
        command_template=tpl, trials_dir=tmp_path / "trials", steps=2, warmup_steps=0, timeout_s=20, poll_s=0.02
    )
    lay = Layout(world_size=4, pp=2, ep=2, micro_batch_size=1)
    m = _run(b, m4, lay, trial_number=3)
    (got,) = [json.loads(p.read_text()) for p in dump.iterdir()]
    assert got["argv"][-len(literal):] == ["--tp=1", "2", "2", "1", "2", "x; rm -rf / $(touch pwned) `id` "
                                                                         "\"'", "a b;c", "$(echo hi)",
                                           "{literal}", "4x4", "2"]  # fmt: skip
    assert "--FAKE_STEPS=2" in got["argv"]
    assert got["env"]["FAKE_EXTRA"] == "x; rm -rf / $(touch pwned) `id` \"'|8192"
    assert (
        got["env"]["NCCL_NVLS_ENABLE"] == "1" and got["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    )  # the template's, then the safe ones
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    d = tmp_path / "trials" / "3"
    assert shlex.split((d / "command.txt").read_text())[2:] == got["argv"]  # after python and the program
    assert m.log_path == str(d) and (d / "log.txt").exists()


def test_list_placeholders_expand_to_the_tuners_flags(tmp_path, m4):
    tpl = load_template(_tpl(tmp_path, {"argv": ["prog", "{model_args}", "--x", "{layout_args}", "{pipeline_layout}"]}))
    lay = Layout(world_size=4, pp=2, vpp=2, ep=2)
    argv, env = tpl.fill(lay, model=m4, cluster=parse_gpus("4xH200"), workload=WL, steps=4)
    ma, la = model_args(m4), layout_args(lay, m4, WL, framework="megatron")
    assert argv == ["prog", *ma, "--x", *la, la[la.index("--pipeline-model-parallel-layout") + 1]] and env == {}
    slime = load_template(_tpl(tmp_path, {"argv": ["prog", "{layout_args}"], "framework": "slime"}, "s.yaml"))
    assert "--max-tokens-per-gpu" in slime.fill(lay, model=m4, cluster=parse_gpus("4xH200"), workload=WL, steps=4)[0]


@pytest.mark.parametrize("argv0", ["bash", "/bin/sh"])
def test_a_shell_script_template_gets_each_value_as_one_word(tmp_path, m4, monkeypatch, argv0):
    """``bash -c SCRIPT``: the pipeline layout's ``|`` and ``*`` and an environment value's ``$(...)`` reach the program
    as they are (quoted in the script), not run by the shell."""
    monkeypatch.setenv("EVIL", f"$(touch {tmp_path}/pwned)")
    tpl = load_template(_tpl(tmp_path, {"argv": [argv0, "-ec", "printf '%s\\n' {pipeline_layout} {env:EVIL} {tp}"]}))
    lay = Layout(world_size=4, pp=2, vpp=2, ep=2)
    argv, _ = tpl.fill(lay, model=m4, cluster=parse_gpus("4xH200"), workload=WL, steps=4)
    import subprocess

    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=True).stdout.splitlines()
    la = layout_args(lay, m4, WL, framework="megatron")
    assert out == [la[la.index("--pipeline-model-parallel-layout") + 1], f"$(touch {tmp_path}/pwned)", "1"]
    assert not (tmp_path / "pwned").exists()


def test_model_args_follow_the_studys_megatron_core_release(tmp_path):
    """GPT-OSS's YaRN flags exist from megatron-core 0.19: a study for 0.18 gets plain RoPE in its trial commands; the
    backend takes the release from the study's settings."""
    from launch.base import BackendSettings
    from launch.command_backend import CommandBackend

    oss = slice_model(load_model("GPT-OSS-120B"), 2)
    tpl = _tpl(tmp_path, {"argv": [sys.executable, "{model_args}"]})
    lay, wl, cl = Layout(world_size=8, ep=8), Workload(seq_length=4096, global_batch_size=64), parse_gpus("8xH100")
    for release, pos in ((None, "yarn"), ("0.19", "yarn"), ("0.18", "rope")):
        backend = CommandBackend.from_settings(
            BackendSettings(command_template=tpl, trials_dir=tmp_path / "t", megatron_core=release)
        )
        argv = backend.template.fill(
            lay, model=oss, cluster=cl, workload=wl, steps=4, megatron_core=backend.megatron_core
        )[0]
        assert argv[argv.index("--position-embedding-type") + 1] == pos, release
        assert any(a.startswith("--yarn-") for a in argv) == (pos == "yarn")


def test_json_template(tmp_path):
    t = load_template(_tpl(tmp_path, json.dumps({"argv": ["prog", "{tp}", 3], "timeout_s": 12}), "t.json"))
    assert t.argv == ("prog", "{tp}", "3") and t.timeout_s == 12.0


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (
            {"argv": ["prog", "{tp}", "--x={bogus}", "{nope}"]},
            "unknown placeholder(s) {bogus}, {nope}; accepted: {tp}, {pp}",
        ),
        ({"argv": ["prog", "--args={model_args}"]}, "{model_args} expands to several arguments"),
        ({"argv": ["prog"], "env": {"X": "{layout_args}"}}, "{layout_args} expands to several arguments"),
        ({"argv": ["prog", "a}b"]}, "a lone '}'"),
        ({"argv": ["prog", "{env:1BAD}"]}, "is not an environment variable name"),
        ({"argv": []}, "argv must be a non-empty list"),
        ({"argv": "prog --tp {tp}"}, "argv must be a non-empty list"),
        ({"argv": ["prog", {"a": 1}]}, "argv elements must be strings or numbers"),
        ({"argv": ["prog"], "timeout_s": -1}, "timeout_s must be a positive number"),
        ({"argv": ["prog"], "env": {"BAD NAME": "1"}}, "is not an environment variable name"),
        ({"argv": ["prog"], "framework": "nemo"}, "framework must be megatron or slime"),
        ({"argv": ["prog"], "shell": True}, "unknown key(s) shell"),
        ("- just\n- a list\n", "expected a mapping"),
        ("argv: [unclosed\n", "not valid YAML"),
    ],
)
def test_template_errors(tmp_path, doc, needle):
    with pytest.raises(TunerError) as e:
        load_template(_tpl(tmp_path, doc))
    assert needle in str(e.value) and str(e.value).startswith("--command-template ")


def test_backend_errors(tmp_path, monkeypatch):
    with pytest.raises(TunerError, match="--backend command needs --command-template FILE"):
        get_backend("command")
    with pytest.raises(TunerError, match="cannot read it"):
        get_backend("command", BackendSettings(command_template=str(tmp_path / "missing.yaml")))
    monkeypatch.delenv("NO_SUCH_VAR_XYZ", raising=False)
    with pytest.raises(TunerError, match="set the environment variable\\(s\\) NO_SUCH_VAR_XYZ"):
        get_backend(
            "command", BackendSettings(command_template=_tpl(tmp_path, {"argv": ["prog", "{env:NO_SUCH_VAR_XYZ}"]}))
        )
    with pytest.raises(TunerError, match="'no-such-program-xyz' \\(argv\\[0\\]\\) is not found"):
        get_backend("command", BackendSettings(command_template=_tpl(tmp_path, {"argv": ["no-such-program-xyz"]})))


def test_layout_that_cannot_be_written_is_infeasible(tmp_path, m4):
    b = _fake(tmp_path, "ok")
    b.template = load_template(_tpl(tmp_path, {"argv": [sys.executable, "{layout_args}"]}, "l.yaml"))
    with pytest.raises(InfeasibleLayout, match="command_template"):
        _run(b, m4, Layout(world_size=4, pp=1, vpp=2, ep=2))


# --------------------------------------------------------------------------- the seed's run block


def _flags(argv: list[str]) -> dict[str, tuple[str, ...]]:
    return argv_flags(argv)


def test_slime_template_reproduces_the_seed_run_block(monkeypatch, minimax, h200x64, seed_workload, seed_tuned):
    seed = yaml.safe_load((FIXTURES / "seed_minimax_m2_recipe.yaml").read_text())
    for name in ("HF_CKPT", "TORCH_DIST", "SFT_DATA", "PROFILE_DIR"):  # the seed's run block leaves them to the shell
        monkeypatch.setenv(name, f"${name}")
    monkeypatch.setenv("SLIME_ENTRY_MODULE", "<slime entry module>")
    tpl = load_template(SLIME_TEMPLATE)
    argv, env = tpl.fill(seed_tuned, model=minimax, cluster=h200x64, workload=seed_workload, steps=20)
    # {model_args} is slime's MODEL_ARGS, which the seed passes as ${MODEL_ARGS[@]}.
    ma = model_args(minimax)
    i = argv.index(ma[0])
    assert argv[i : i + len(ma)] == ma
    ours_argv = argv[:i] + ["${MODEL_ARGS[@]}"] + argv[i + len(ma) :]
    run = seed["run"].replace("\\\n", " ")
    line = next(ln for ln in run.splitlines() if ln.strip().startswith("python3 -m"))
    theirs_argv = shlex.split(line.replace("<slime entry module>", "'<slime entry module>'"))
    assert ours_argv[:4] == theirs_argv[:4] == ["python3", "-m", "<slime entry module>", "--async"]
    theirs, ours = _flags(theirs_argv), _flags(ours_argv)
    assert {f: ours.get(f) for f in theirs} == theirs  # every flag of the seed, with its values
    assert set(ours) - set(theirs) == {"--moe-token-dispatcher-type"}  # in slime's MODEL_ARGS for the seed
    assert ours["--moe-token-dispatcher-type"] == ("alltoall",)
    assert ours["--pipeline-model-parallel-layout"] == ("Et|(tt|)*30tL",)
    seed_env = {k: v for k, v in seed["env"].items() if k != "NCCL_NVLS_ENABLE"}  # a shell expression; the tuner sets 0
    assert env == seed_env


# --------------------------------------------------------------------------- the log parser


def test_parse_normal_log():
    log = parse_megatron_log((LOGS / "normal.log").read_bytes())
    assert [it.iteration for it in log.iterations] == [1, 2, 3, 4, 5, 6] and log.bad_lines == 0 and not log.truncated
    assert log.iterations[0].step_time_s == pytest.approx(19.1388) and log.iterations[0].loss == pytest.approx(10.43863)
    assert log.iterations[0].grad_norm == pytest.approx(26.203)
    assert len(log.memory) == 3 and log.memory[1].rank == 3
    assert log.peak_reserved_bytes == 20480.0 * MIB and log.peak_allocated_bytes == 17001.25 * MIB
    s = log.summary(global_batch_size=8, seq_length=8192, world_size=4, warmup_steps=2)
    assert s["median_step_time_s"] == pytest.approx(1.0)  # median of 1.0, 1.1, 0.9, 1.0
    assert s["tokens_per_s_per_gpu"] == pytest.approx(8 * 8192 / 1.0 / 4)


def test_parse_truncated_log():
    data = (LOGS / "truncated.log").read_bytes()
    log = parse_megatron_log(data)
    assert [it.iteration for it in log.iterations] == [1, 2, 3] and log.truncated and log.bad_lines == 0
    # The same file fed in small pieces (a log read while it grows) gives the same result.
    r = MegatronLogReader()
    for k in range(0, len(data), 7):
        r.feed(data[k : k + 7])
        assert all(it.step_time_s > 0.5 for it in r.log.iterations)  # never a cut-off "11" ms
    assert r.finish().iterations == log.iterations
    # A cut-off value with a newline after it is not taken either.
    cut = parse_megatron_log(
        " iteration 4/6 | elapsed time per iteration (ms): 11\n[Rank 0] (after 4 iterations) memory (MB) | allocated: "
        "1.0 | max allocated: 2.0 | reserved: 3.0 | max reserved: 16\n"
    )
    assert cut.iterations == [] and cut.memory == [] and cut.bad_lines == 2


def test_parse_garbled_log():
    log = parse_megatron_log((LOGS / "garbled.log").read_bytes())
    assert [it.iteration for it in log.iterations] == [1, 2, 4, 5, 6]
    assert log.bad_lines == 3 and len(log.memory) == 3 and log.peak_reserved_bytes == 20480.0 * MIB


def test_failure_logs_classify_like_the_local_backend(tmp_path, m4):
    for name, kind, needle in (
        ("oom", FailureKind.oom, "out of memory at 138.8 GiB"),
        ("nccl", FailureKind.crash, "NCCL error"),
    ):
        doc = {
            "argv": [
                sys.executable,
                "-c",
                f"import sys; sys.stdout.write(open({str(LOGS / (name + '.log'))!r}).read()); sys.exit(1)",
            ]
        }
        b = CommandBackend(
            command_template=_tpl(tmp_path, doc, name + ".yaml"), trials_dir=tmp_path / name, steps=4, warmup_steps=1,
            poll_s=0.02,
        )
        with pytest.raises(TrialFailed) as e:
            _run(b, m4)
        assert e.value.kind == kind and needle in str(e.value), str(e.value)


# --------------------------------------------------------------------------- trials end to end


def test_trial_files_and_measurement_extras(tmp_path, m4):
    m = _run(_fake(tmp_path, "ok", iters=6, step_ms=100.0), m4, trial_number=7)
    assert m.tokens_per_s_per_gpu == pytest.approx(8 * 8192 / 0.1 / 4) and m.step_times_s == pytest.approx((0.1,) * 4)
    assert m.grad_norms[0] == pytest.approx(2.0) and m.losses[0] == pytest.approx(9.9)  # the log's values
    assert (
        m.extra["summary"]["iterations"] == 6
        and m.extra["summary"]["memory_reports"] == 2
        and m.extra["summary"]["bad_lines"] == 0
    )
    assert m.extra["notes"] == [f"command backend: {tmp_path / 't.yaml'}"]
    assert {p.name for p in (tmp_path / "trials" / "7").iterdir()} == {
        "log.txt",
        "command.txt",
        "command.json",
        "process.json",
    }


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("crash", "crash (exit status 7): ValueError: bad batch (log: "),
        (
            "silent",
            "the command exited without any Megatron iteration line (elapsed time per iteration): crash (exit status "
            "0)",
        ),
    ],
)
def test_failure_messages(tmp_path, m4, mode, needle):
    with pytest.raises(TrialFailed) as e:
        _run(_fake(tmp_path, mode), m4)
    assert e.value.kind == FailureKind.crash and needle in str(e.value) and str(e.value).endswith("log.txt)")


def test_the_templates_timeout_wins_over_the_backends(tmp_path):
    assert _fake(tmp_path, "hang", timeout_s=1.5).timeout_s == 1.5
    assert _fake(tmp_path, "hang").timeout_s == 20.0


# --------------------------------------------------------------------------- the command line


@pytest.mark.slow
def test_cli_errors_and_a_study(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    runner = CliRunner()
    base = ["--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200", "--global-batch", "8", "--stack", "megatron"]
    r = runner.invoke(app, [*base, "--backend", "command"])
    assert r.exit_code == 2 and "--backend command needs --command-template FILE" in r.output
    r = runner.invoke(app, [*base, "--command-template", str(_tpl(tmp_path, {"argv": ["prog"]}))])
    assert r.exit_code == 2 and "--command-template is for --backend command" in r.output
    r = runner.invoke(
        app,
        [
            *base,
            "--backend",
            "command",
            "--command-template",
            str(_tpl(tmp_path, {"argv": ["prog", "{tpp}"]}, "b.yaml")),
        ],
    )
    assert r.exit_code == 2 and "unknown placeholder(s) {tpp}" in r.output
    tpl = _tpl(tmp_path, {"argv": [*_megatron("ok", 2000.0), "{layout_args}"]}, "ok.yaml")  # 2 s steps: a plausible MFU
    r = runner.invoke(app, [*base, "--backend", "command", "--command-template", str(tpl), "--trials", "2",
                            "--trial-steps", "4", "--results-dir", str(tmp_path / "res"),
                            "--study", "cmd"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "command backend" in r.output and "Best layout (measured" in r.output
    logs = sorted((tmp_path / "res" / "cmd" / "trials").glob("*/log.txt"))
    assert len(logs) >= 1 and all("elapsed time per iteration" in p.read_text() for p in logs)


def test_a_measurement_above_the_gpus_peak_is_flagged_and_kept_out_of_the_best(tmp_path):
    """A template that runs less work than the study assumes: 1 ms steps (MFU far above 100%), and 200 ms steps (MFU
    about 60%, but 2.4 x the predicted throughput, past the top of the model's band by more than its width). Each
    trial is kept, marked implausible with the question to ask, and is not the best; the outputs are written from
    the others."""
    import optuna
    from typer.testing import CliRunner

    from tuner.cli import app
    from tuner.study import trial_rows

    runner = CliRunner()
    args = [
        "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200", "--global-batch", "8", "--stack", "megatron",
        "--backend", "command", "--trials", "1", "--trial-steps", "4", "--results-dir", str(tmp_path / "res"),
        "--study", "c",
    ]
    for name, step_ms in (("ok.yaml", 2000.0), ("fast.yaml", 1.0), ("floor.yaml", 200.0)):
        tpl = _tpl(tmp_path, {"argv": [*_megatron("ok", step_ms), "{layout_args}"]}, name)
        r = runner.invoke(app, [*args, "--command-template", str(tpl)])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    st = optuna.load_study(study_name="c", storage=f"sqlite:///{tmp_path / 'res' / 'c' / 'study.db'}")
    mfu_bad, floor_bad = [t.user_attrs["failure"] for t in st.trials if t.state == optuna.trial.TrialState.FAIL]
    for fail in (mfu_bad, floor_bad):
        assert fail["kind"] == "implausible" and "{global_batch_size} and {seq_length}" in fail["message"]
    assert mfu_bad["result"]["mfu"] > 1 and "MFU" in mfu_bad["message"]
    assert floor_bad["result"]["mfu"] < 1 and "by more than its error bar" in floor_bad["message"]
    assert [r.trial for r in trial_rows(st)] == [0]  # the front and the best hold only the plausible trial
    assert (tmp_path / "res" / "c" / "recipe.yaml").is_file()
