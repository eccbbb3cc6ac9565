"""`reasonrl serve`: started as a subprocess on a free loopback port it prints its URL, answers
the `openai` client with the token ids, and stops cleanly on SIGTERM; a run folder serves its
newest checkpoint as that step's policy version."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from reasonrl.commands.serve import newest_checkpoint
from reasonrl.serve.app import free_port

NEEDED = ("fastapi", "uvicorn", "openai")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in NEEDED),
                    reason="needs fastapi and uvicorn (the `serve` extra) and the `openai` client")
def test_serve_answers_the_openai_client_and_stops_on_sigterm():
    import openai

    port = free_port()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "reasonrl", "serve", "tiny", "--port", str(port),
                             "rollout.hf_decoder=lean", "trainer.threads=1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline, lines = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if " at http://" in line:
                break
        url = f"http://127.0.0.1:{port}/v1"
        assert any(url in line for line in lines), "".join(lines)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, seed=0)
        assert r.prompt_token_ids and 1 <= len(r.choices[0].token_ids) <= 4 and r.policy_version == 0
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "stopped: 1 prompts served in 1 generate calls" in out


def test_a_run_folder_serves_its_newest_checkpoint(tmp_path):
    run = tmp_path / "run"
    for step in (2, 10):
        folder = run / "checkpoints" / f"step_{step}"
        (folder / "huggingface").mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
        (folder / "state.pt").write_bytes(b"")
    (run / "checkpoints" / "step_11").mkdir()  # incomplete: passed over
    assert newest_checkpoint(str(run)) == (str(run / "checkpoints" / "step_10"), 10)
    assert newest_checkpoint(str(run / "checkpoints" / "step_2")) == (str(run / "checkpoints" / "step_2"), 2)
    assert newest_checkpoint("tiny") == ("tiny", 0)
