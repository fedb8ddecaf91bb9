"""Strict startup: refused configurations exit non-zero naming the fix, and never serve; the banner."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from serve_helpers import ROOT, free_port


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """An EAGLE-3 draft built for a different (32-wide) tiny target."""
    from helpers import tiny_target

    from eyas.models.draft import Eagle3Draft

    path = tmp_path_factory.mktemp("other") / "draft"
    Eagle3Draft.for_target(tiny_target(hidden_size=32)).save_pretrained(path)
    return path


def refusals(tiny, draft, other_draft):
    m, d = ["--model-path", str(tiny), "--dtype", "float64"], ["--speculative-draft-model-path", str(draft)]
    return {
        "EAGLE with an EAGLE-3 draft": (m + d + ["--speculative-algorithm", "EAGLE"],
                                        ["EAGLE3", "--speculative-algorithm EAGLE3", "accept length 1.00"]),
        "NONE with a draft": (m + d + ["--speculative-algorithm", "NONE"], ["NONE", "EAGLE3"]),
        "EAGLE3 without a draft": (m + ["--speculative-algorithm", "EAGLE3"], ["needs a draft", "EAGLE3"]),
        "tree larger than it can hold": (m + d + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                                                  "--speculative-num-draft-tokens", "8"],
                                         ["--speculative-num-draft-tokens", "at most 3"]),
        "draft for another target": (m + ["--speculative-draft-model-path", str(other_draft)],
                                     ["built for another target"]),
        "context longer than the target's": (m + d + ["--context-length", "5000"], ["--context-length", "1024"]),
        "no running slots": (m + d + ["--max-running-requests", "0"], ["--max-running-requests"]),
        "switch interval of zero": (m + d + ["--switch-interval-ms", "0"], ["--switch-interval-ms", "milliseconds"]),
        "a negative membership wait": (m + d + ["--membership-wait-steps", "-1"], ["--membership-wait-steps", "0"]),
        "a sampling default out of range": (m + d + ["--override-generation-config", '{"temperature": 5}'],
                                            ["--override-generation-config", "temperature", "[0, 2]"]),
        "no generation config in the folder named": (m + d + ["--generation-config", str(draft / "nowhere")],
                                                     ["--generation-config", "generation_config.json"]),
    }


# The two refusals the story is about run as real processes; the rest through the same entry
# point in-process (``eyas.cli.main`` is what ``python -m eyas.serve`` calls), which saves the
# import time of a process each.
IN_A_PROCESS = ("EAGLE with an EAGLE-3 draft", "EAGLE3 without a draft")


def test_refused_configurations_exit_nonzero_naming_the_fix_in_a_process(models, other_draft):
    tiny, draft = models
    cases = refusals(tiny, draft, other_draft)
    procs = {}
    for name in IN_A_PROCESS:  # both at once: each pays the import time
        procs[name] = subprocess.Popen([sys.executable, "-m", "eyas.serve", *cases[name][0], "--port",
                                        str(free_port())], cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    failures = []
    for name, p in procs.items():
        out, err = p.communicate(timeout=240)
        failures += _check(name, p.returncode, out, err, cases[name][1])
    assert not failures, "\n\n".join(failures)


def test_other_refused_configurations_through_the_same_entry_point(models, other_draft, capsys):
    from eyas.cli import main

    tiny, draft = models
    failures = []
    for name, (args, words) in refusals(tiny, draft, other_draft).items():
        if name in IN_A_PROCESS:
            continue
        rc = main(["serve", *args, "--port", str(free_port())])
        out, err = capsys.readouterr()
        failures += _check(name, rc, out, err, words)
    assert not failures, "\n\n".join(failures)


def _check(name: str, rc: int, out: str, err: str, words: list[str]) -> list[str]:
    if rc != 2 or not all(w in err for w in words) or "Traceback" in err or "serving" in out:
        return [f"{name}: rc={rc}\nstdout: {out[-500:]}\nstderr: {err[-1500:]}"]
    if not any(line.startswith("eyas: error:") for line in err.splitlines()):
        return [f"{name}: message shape: {err[:300]}"]
    return []


def test_port_in_use_is_refused_before_loading(models):
    tiny, draft = models
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "eyas", "serve", "--model-path", str(tiny),
                            "--speculative-draft-model-path", str(draft), "--port", str(port)],
                           cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert p.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in p.stderr and "--port" in p.stderr
    assert "loading" not in p.stdout


def test_a_host_that_is_not_this_machines_names_the_host_not_the_port(capsys):
    from eyas.cli import main

    assert main(["serve", "--host", "999.1.1.1", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "cannot listen on 999.1.1.1" in err and "pass an address of this machine" in err


def test_banner_shows_what_debugging_needs(server):
    out = server.stdout()
    for line in ["speculative algorithm: EAGLE3",
                 "captured layers: [2, 4, 5]",
                 "SGLang eagle_aux_hidden_state_layer_ids [1, 3, 4]",
                 "aux hidden states: 3 x 64 = 192 -> fc 192 -> 64",
                 "draft vocabulary: 320 of 320 target tokens",
                 "tree: num_steps 3, eagle_topk 2, num_draft_tokens 6",
                 "context length: 1024",
                 "max running requests: 32",
                 "sampling defaults: OpenAI's (temperature 1, top_p 1): the target's generation_config.json sets none"]:
        assert line in out, out
    assert out.index("aux hidden states") < out.index("serving")


def test_log_lines_report_acceptance(server):
    import httpx

    httpx.post(server.url + "/v1/completions", json={"prompt": "log me", "max_tokens": 8, "temperature": 0},
               timeout=60)
    log = server.stderr()
    assert "decode: running" in log and "accept len" in log
    assert "request " in log and "output tokens" in log


def test_without_the_serve_extra_the_message_says_what_to_install(models):
    tiny, _ = models
    code = ("import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None\n"
            "from eyas.cli import main\n"
            f"sys.exit(main(['serve', '--model-path', {str(tiny)!r}, '--port', '{free_port()}']))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240,
                       check=False)
    assert p.returncode == 2, p.stderr
    assert "pip install 'eyas[serve]'" in p.stderr
