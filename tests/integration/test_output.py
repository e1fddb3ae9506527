"""Worker output through the agent: whole lines, prefixes, filters, per-rank files, backpressure."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import RANKRUN, clean_environ, payload, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

LINE = re.compile(r"^\[default(\d)\]:rank(\d)-line(\d+)-x{300}-end$")


def test_eight_ranks_long_lines_are_never_spliced(tmp_path):
    res = run_cli("--nproc-per-node", "8", payload("spam.py"), "2000", "300", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")
    assert lines[-1] == ""
    body = [ln for ln in lines[:-1] if "partial-no-newline" not in ln]
    bad = [ln[:120] for ln in body if not (m := LINE.match(ln)) or m.group(1) != m.group(2)]
    assert bad == [], f"{len(bad)} spliced lines, e.g. {bad[:3]}"
    assert len(body) == 8 * 2000
    for rank in range(8):
        mine = [int(m.group(3)) for ln in body if (m := LINE.match(ln)) and m.group(1) == str(rank)]
        assert mine == list(range(2000)), f"rank {rank} lines lost or reordered"
    # a last line without a newline is completed, not glued to another rank's output
    tails = [ln for ln in lines if "partial-no-newline" in ln]
    assert sorted(tails) == [f"[default{r}]:partial-no-newline-rank{r}" for r in range(8)]


def test_prefix_template_from_environment_and_flag(tmp_path):
    script = tmp_path / "hi.py"
    script.write_text("print('hi')\n")
    env = clean_environ() | {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}/${rank}/${local_rank}> "}
    res = run_cli("--nproc-per-node", "2", "--role", "trainer", str(script), env=env)
    assert sorted(res.stdout.splitlines()) == ["<trainer/0/0> hi", "<trainer/1/1> hi"]
    res = run_cli("--nproc-per-node", "2", "--log-line-prefix-template", "", str(script))
    assert res.stdout.splitlines() == ["hi", "hi"]


def test_local_ranks_filter_limits_the_console(tmp_path):
    script = tmp_path / "hi.py"
    script.write_text("import os, sys\nprint('out', os.environ['RANK'])\nprint('err', os.environ['RANK'], file=sys.stderr)\n")
    res = run_cli("--nproc-per-node", "3", "--local-ranks-filter", "1", str(script))
    assert res.stdout.splitlines() == ["out 1"]  # one rank on the console: raw, as torchrun's default output
    assert res.stderr.splitlines() == ["err 1"]
    res = run_cli("--nproc-per-node", "3", "--local-ranks-filter", "0,2", str(script))
    assert sorted(res.stdout.splitlines()) == ["[default0]:out 0", "[default2]:out 2"]


def test_a_filter_naming_no_local_rank_of_this_node_says_so_once(tmp_path):
    script = tmp_path / "hi.py"
    script.write_text("import os\nprint('out', os.environ['RANK'])\n")
    res = run_cli("--nproc-per-node", "2", "--local-ranks-filter", "7", str(script))
    assert (res.returncode, res.stdout) == (0, "")
    assert res.stderr.splitlines() == ["rankrun: warning: --local-ranks-filter 7 names no local rank of this node"
                                       " (it runs local ranks 0-1): no worker's output reaches its console"]
    res = run_cli("--nproc-per-node", "2", "--local-ranks-filter", "1,7", str(script))  # some of them: said nothing
    assert (res.returncode, res.stdout, res.stderr) == (0, "out 1\n", "")


def _tree(base: Path) -> list[str]:
    return sorted(str(p.relative_to(base)) for p in base.rglob("*"))


@pytest.mark.parametrize(
    ("flags", "console_out", "console_err", "files"),
    [
        (["-r", "3"], [], [], {"0/stdout.log", "0/stderr.log", "1/stdout.log", "1/stderr.log"}),
        (["-t", "3"], ["[default0]:out 0", "[default1]:out 1"], ["[default0]:err 0", "[default1]:err 1"],
         {"0/stdout.log", "0/stderr.log", "1/stdout.log", "1/stderr.log"}),
        (["-r", "1", "-t", "2"], [], ["[default0]:err 0", "[default1]:err 1"], {"0/stdout.log", "0/stderr.log", "1/stdout.log", "1/stderr.log"}),
        (["-t", "0:3,1:1"], ["[default0]:out 0", "[default1]:out 1"], ["[default0]:err 0", "[default1]:err 1"],
         {"0/stdout.log", "0/stderr.log", "1/stdout.log"}),
    ],
)
def test_redirects_and_tee_keep_torchrun_layout(tmp_path, flags, console_out, console_err, files):
    script = tmp_path / "hi.py"
    script.write_text("import os, sys\nprint('out', os.environ['RANK'])\nprint('err', os.environ['RANK'], file=sys.stderr)\n")
    logs = tmp_path / "logs"
    res = run_cli("--nproc-per-node", "2", "--log-dir", str(logs), "--rdzv-id", "job7", "--master-port", "0",
                  *flags, str(script))
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == console_out
    assert sorted(res.stderr.splitlines()) == console_err
    (run_dir,) = list(logs.iterdir())
    assert re.fullmatch(r"job7_\w+", run_dir.name)
    attempt = run_dir / "attempt_0"
    found = {p for p in _tree(attempt) if p.endswith(".log")}
    assert found == files
    assert {p for p in _tree(attempt) if "/" not in p} == {"0", "1"}
    if "0/stdout.log" in files:
        assert (attempt / "0" / "stdout.log").read_text() == "out 0\n"


def test_log_dir_holds_error_json_of_recorded_failure_and_env_points_at_it(tmp_path):
    script = tmp_path / "dump.py"
    script.write_text("import json, os\nprint(json.dumps(os.environ['TORCHELASTIC_ERROR_FILE']))\n")
    logs = tmp_path / "logs"
    res = run_cli("--nproc-per-node", "2", "--log-dir", str(logs), "--log-line-prefix-template", "", str(script))
    assert res.returncode == 0, res.stderr
    paths = sorted(json.loads(line) for line in res.stdout.splitlines())
    (run_dir,) = list(logs.iterdir())
    assert paths == [str(run_dir / "attempt_0" / str(r) / "error.json") for r in range(2)]


def test_log_dir_dev_null_writes_nothing_and_empty_error_file(tmp_path):
    script = tmp_path / "dump.py"
    script.write_text("import os\nprint(repr(os.environ['TORCHELASTIC_ERROR_FILE']))\n")
    res = run_cli("--nproc-per-node", "2", "--log-dir", "/dev/null", "-r", "3", "--log-line-prefix-template", "",
                  str(script))
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""  # redirected: not on the console, and no files either


def test_duplicate_stdout_filters_write_filtered_log(tmp_path):
    script = tmp_path / "f.py"
    script.write_text("print('keep, this')\nprint('drop this')\nprint('loss=1.0')\n")
    logs = tmp_path / "logs"
    res = run_cli("--nproc-per-node", "1", "--log-dir", str(logs), "-t", "3", "--duplicate-stdout-filters", "keep,,,loss=",
                  str(script))
    assert res.returncode == 0, res.stderr
    (run_dir,) = list(logs.iterdir())
    assert (run_dir / "attempt_0" / "filtered_stdout.log").read_text() == "[default0]:keep, this\n[default0]:loss=1.0\n"


def test_slow_console_loses_no_lines(tmp_path):
    """The launcher's stdout is a pipe read slowly; the worker outruns it and must block, not drop."""
    env = clean_environ()
    with subprocess.Popen([*RANKRUN, "--nproc-per-node", "2", payload("spam.py"), "20000", "100"], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        count = 0
        while chunk := proc.stdout.read(4096):  # small reads: the pipe stays full most of the time
            count += chunk.count(b"\n")
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, err
    assert count == 2 * 20000 + 2
