"""What `fedhet deploy local` prints: one progress line per round (overwritten in place on a
terminal, one line each in a log file), and where the Flower logs end up."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install fedhet[flower])")

from fedhet.deploy.command import LOGS_DIR, Echo  # noqa: E402
from fedhet.deploy.launch import LocalFederation  # noqa: E402
from fedhet.deploy.server_app import progress_line  # noqa: E402
from fedhet.rundir import ownership as rundir  # noqa: E402


def test_progress_line_has_round_accuracy_loss_pace_and_eta():
    row = {"round": 4, "test_accuracy": 0.81234, "test_loss": 0.5, "round_time_s": 9.0}
    # 4 rounds in 10 s: 2.5 s/round; 6 rounds left: 15 s
    assert progress_line(row, 10, 0, 10.0) == (
        "fedhet: round 4/10: accuracy 0.8123, loss 0.5000, 2.50 s/round, ETA 15 s")
    # a round that is not evaluated (eval_every) has no accuracy or loss to show
    assert progress_line({"round": 3, "test_accuracy": float("nan"), "test_loss": float("nan")},
                         3, 1, 4.0) == "fedhet: round 3/3: 2.00 s/round, ETA 0 s"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_round_lines_overwrite_each_other_on_a_terminal_only():
    lines = ["fedhet: 2 SuperNodes joined in 1.0 s",
             "fedhet: round 1/2: accuracy 0.5000, loss 1.0000, 1.00 s/round, ETA 1 s",
             "fedhet: round 2/2: accuracy 0.6000, loss 0.9000, 1.00 s/round, ETA 0 s",
             "fedhet: finished with 2 of 2 SuperNodes"]
    log = io.StringIO()
    echo = Echo(log)
    for line in lines:
        echo(line)
    echo.close()
    assert log.getvalue() == "".join(f"{line}\n" for line in lines)

    tty = Tty()
    echo = Echo(tty)
    for line in lines:
        echo(line)
    echo.close()
    assert tty.getvalue() == (f"{lines[0]}\n\r\033[K{lines[1]}\r\033[K{lines[2]}\n{lines[3]}\n")


def test_logs_are_copied_into_the_run_directory_and_owned_by_it(tmp_path):
    out = tmp_path / "out"
    fed = LocalFederation(1, logs_to=out / LOGS_DIR)
    assert fed.shown_logs == out / LOGS_DIR
    fed.logs.mkdir(parents=True)
    (fed.logs / "superlink.log").write_text("hello\n")
    fed.__exit__(None, None, None)
    assert (out / LOGS_DIR / "superlink.log").read_text() == "hello\n"
    assert not fed.workdir.exists()  # the temporary home is gone, the logs are not
    # `--force` replaces them with the rest of the run
    assert LOGS_DIR in rundir.OWNED_DIRS
