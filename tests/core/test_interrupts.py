"""envace.core.interrupts: Ctrl-C, SIGTERM and SIGHUP stop a command on one path, a commit's
renames are not cut in two, and forked children keep what the signals did before. Real signals,
sent by the process to itself."""

from __future__ import annotations

import os
import signal

import pytest

from envace.core.interrupts import (
    Stopped,
    note_written,
    signals_held,
    stop_signals,
    stopped_line,
)


def _let_handlers_run() -> None:
    """Python runs a signal's handler between bytecodes: a few of them."""
    for _ in range(100):
        pass


@pytest.fixture(autouse=True)
def _python_handlers():
    """Each test starts from Python's own handlers (a suite started in the background may
    inherit SIGINT ignored) and leaves them as it found them."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for s, h in before.items():
        signal.signal(s, h)


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "SIGTERM"),
                                                   (signal.SIGHUP, 129, "SIGHUP")])
def test_each_stop_signal_raises_stopped_and_is_recorded(sig, code, word):
    with stop_signals() as stop, pytest.raises(Stopped) as caught:
        os.kill(os.getpid(), sig)
        _let_handlers_run()
    assert caught.value.signum == sig and stop.signum == sig and stop.exit_code == code
    line = stopped_line("prog", stop)
    assert word in line and "nothing written" in line and "\n" not in line
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored on leaving
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored():
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    with stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGHUP)
    assert stop.signum is None and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_a_signal_held_takes_effect_after_the_steps_and_the_line_says_what_is_complete(tmp_path):
    done = []
    with stop_signals() as stop, pytest.raises(Stopped), signals_held():
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("first")  # not cut here
        note_written(tmp_path)
        done.append("second")
    assert done == ["first", "second"]
    assert stop.written == [tmp_path] and stop.signum == signal.SIGTERM
    assert "after its output was complete" in stopped_line("prog", stop)


def test_a_held_ctrl_c_outside_stop_signals_raises_keyboard_interrupt_after():
    done = []
    with pytest.raises(KeyboardInterrupt), signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        done.append(1)
    assert done == [1]


def test_a_forked_child_keeps_what_the_signal_did_before():
    """A worker or an environment forked within stop_signals ends by SIGTERM as before (no
    Stopped raised in it, no traceback), and Ctrl-C still raises KeyboardInterrupt there."""
    with stop_signals():
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                _let_handlers_run()
                os._exit(0)  # not reached: SIGTERM's default action ends it
            except BaseException:
                os._exit(7)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        pid = os.fork()
        if pid == 0:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                _let_handlers_run()
                os._exit(0)
            except Stopped:
                os._exit(5)
            except KeyboardInterrupt:
                os._exit(9)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 9


def test_a_final_scope_leaves_a_finished_command_to_exit_with_its_code():
    pid = os.fork()
    if pid == 0:
        with stop_signals(final=True):
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        _let_handlers_run()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_forked_child_busy_in_c_code_still_ends_on_sigterm_at_once():
    """A Python handler runs only between bytecodes: the child gets the dispositions before
    back at fork, so a worker stuck in C code ends on SIGTERM as it did (it once took seconds)."""
    import time

    with stop_signals():
        pid = os.fork()
        if pid == 0:
            sum(range(10**11))  # one C call, minutes long
            os._exit(0)
        time.sleep(0.2)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    assert time.monotonic() - t0 < 2


def test_stopped_pickles_and_copies_by_its_signal():
    import copy
    import pickle

    for e in (pickle.loads(pickle.dumps(Stopped(signal.SIGTERM))), copy.copy(Stopped(1))):
        assert isinstance(e, Stopped)
    assert pickle.loads(pickle.dumps(Stopped(signal.SIGTERM))).signum == signal.SIGTERM


def test_a_second_stop_while_stopping_does_not_cut_the_cleanup_short():
    cleaned = []
    with stop_signals() as stop:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            _let_handlers_run()
        except Stopped:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C pressed again during the cleanup
            _let_handlers_run()
            cleaned.append(True)
    assert cleaned == [True] and stop.signum == signal.SIGINT


def test_a_third_stop_does_what_the_signal_did_before():
    """Two stops leave the cleanup alone; a third, the user insisting, is Python's own Ctrl-C."""
    with stop_signals() as stop:
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGINT)
            _let_handlers_run()
        os.kill(os.getpid(), signal.SIGINT)  # ignored
        _let_handlers_run()
        with pytest.raises(KeyboardInterrupt) as caught:
            os.kill(os.getpid(), signal.SIGINT)
            _let_handlers_run()
    assert not isinstance(caught.value, Stopped) and stop.count == 3


@pytest.mark.parametrize("prog", ["audit.cli", "envace.cli.main"])
def test_a_stop_that_something_swallowed_still_ends_the_command(prog, monkeypatch, capsys):
    """A plugin's loader or a server's close that catches everything once turned SIGTERM into
    a note or exit 2, and later stops were ignored: the command now ends with 143 and its line."""
    import importlib

    mod = importlib.import_module(prog)

    def swallowing(argv):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            _let_handlers_run()
        except BaseException:  # noqa: BLE001 - what the swallowing code does
            pass
        return 0

    monkeypatch.setattr(mod, "_main", swallowing)
    assert mod.main([]) == 143
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SIGTERM" in err
