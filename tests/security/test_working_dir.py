"""Issue 46.10: a state server imports nothing from the job's working directory.

``python -m`` puts the working directory first on ``sys.path``; the JVM started its state servers
in its own working directory, so a ``rocksdict.py`` planted in a world-writable launch directory
ran inside every server, with the secrets in its environment. A server now starts in its private
work dir with Python's ``-P`` semantics (``PYTHONSAFEPATH``), and still honours ``PYTHONPATH``
(this suite's own imports of keyedstate reach the servers through it).

A session JVM is started from a world-writable directory holding a planted ``rocksdict.py`` that
records where it ran; its query must run exactly on keyedstate and the module must not run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.constants import PFX
from support.sessions import SessionProcess

pytestmark = pytest.mark.timeout(400)

PLANTED = '''
import os
with open({marker!r}, "a") as f:
    f.write("planted rocksdict ran in pid %d, cwd %s\\n" % (os.getpid(), os.getcwd()))
raise ImportError("planted module")
'''


def test_a_module_planted_in_the_launch_directory_is_not_imported(tmp_path):
    launch = tmp_path / "launch"
    launch.mkdir()
    os.chmod(launch, 0o777)  # world-writable, as /tmp or a shared job directory
    marker = tmp_path / "planted-ran"
    (launch / "rocksdict.py").write_text(PLANTED.format(marker=str(marker)))
    session = SessionProcess(tmp_path / "session", confs={PFX + "serverProcesses": "1"}, cwd=launch)
    try:
        keys = [f"k{i % 5}" for i in range(20)]
        result = session.run(tmp_path / "checkpoint", tmp_path / "input", keys)
        servers = session.servers()
        ran = marker.read_text() if marker.exists() else ""
        assert not ran, f"a module planted in the JVM's working directory ran in a state server: {ran}"
        assert result["ok"], f"the query failed: {result.get('error', '')[:2000]}"
        assert result["counts"] == {f"k{i}": 4 for i in range(5)}
        assert servers, "no state server ran"
        for pid in servers:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            assert not cwd.is_relative_to(launch), f"state server {pid} runs in {cwd}"
    finally:
        session.kill()
