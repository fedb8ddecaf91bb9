"""``eyas prepare --regenerate-url`` against a real ``eyas serve`` on loopback, and its retry policy
against a fault-injecting fake server.

The target is a tiny random Llama made chatty: its greedy answers differ from prompt to prompt and
stay printable ASCII, so answer text survives the trip through the server's detokenizer and the
local re-tokenization exactly, and the comparison with in-process answers means something.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from helpers import InProcessServer, byte_tokenizer, free_port, tiny_model

from eyas.cli import main
from eyas.data.regenerate import RegenConfig
from eyas.data.remote import ANSWERS, RemoteConfig, RemoteRegenerator
from eyas.data.served import PROBE
from eyas.data.tokenizer_target import TokenizerTarget
from eyas.errors import EyasError
from eyas.models.target import TargetInfo

ROOT = Path(__file__).resolve().parents[2]
NAME = "chatty"
TOPICS = ["rivers", "owls", "prime numbers", "tea", "glaciers", "chess", "violins", "comets", "bread", "tides"]


def save_chatty(path: Path, seed: int = 2) -> Path:
    """A complete model folder: lm_head rows outside printable ASCII and <|im_end|> zeroed, weights
    at initializer 0.3 (sharp logits: no near ties in float32)."""
    tok = byte_tokenizer()
    model = tiny_model(seed, torch.float32, initializer_range=0.3)
    keep = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    keep[32:127] = True
    keep[tok.convert_tokens_to_ids("<|im_end|>")] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def config_only(full: Path, dest: Path, **config_changes) -> Path:
    """``full`` without its weights (what a laptop holds of a 1 TB target)."""
    dest.mkdir(parents=True)
    for f in full.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dest / f.name)
    if config_changes:
        cfg = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**cfg, **config_changes}))
    return dest


def prompts(path: Path, n: int, offset: int = 0) -> Path:
    with path.open("w") as f:
        for i in range(offset, offset + n):
            text = f"Tell me {i % 3 + 1} facts about {TOPICS[i % len(TOPICS)]}, number {i}."
            f.write(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n")
    return path


def lines(path: Path) -> list[dict]:
    """The readable JSON lines of a file (an interrupted last line is skipped)."""
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


class Server:
    """``python -m eyas.serve`` on a fixed port, so it can be killed and started again at the same URL."""

    def __init__(self, model: Path, log_dir: Path):
        self.model, self.port = model, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / "server.err"
        self.proc = None

    def start(self) -> Server:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "eyas.serve", "--model-path", str(self.model),
                                          "--dtype", "float32", "--served-model-name", NAME, "--port", str(self.port)],
                                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        end = time.time() + 180
        while time.time() < end:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(self.log.read_text()[-3000:])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def chat_requests(self) -> int:
        """Chat requests the server answered, from its one-JSON-line-per-request log."""
        return sum('"path": "/v1/chat/completions"' in ln and '"status": 200' in ln
                   for ln in self.log.read_text().splitlines())


@pytest.fixture(scope="module")
def chatty(tmp_path_factory) -> tuple[Path, Path]:
    """(the full model folder, a config+tokenizer copy of it), both named NAME."""
    root = tmp_path_factory.mktemp("chatty")
    full = save_chatty(root / "full" / NAME)
    return full, config_only(full, root / "config-only" / NAME)


@pytest.fixture(scope="module")
def server(chatty, tmp_path_factory):
    s = Server(chatty[0], tmp_path_factory.mktemp("server")).start()
    yield s
    s.stop()


def test_greedy_answers_equal_the_in_process_regeneration(chatty, server, tmp_path, capsys):
    full, weightless = chatty
    src = prompts(tmp_path / "in.jsonl", 10)
    common = ["--input", str(src), "--temperature", "0", "--max-new-tokens", "40", "--held-out", "0.3"]
    assert main(["prepare", "--model-path", str(weightless), "--out", str(tmp_path / "remote"), *common,
                 "--regenerate-url", server.url, "--concurrency", "3"]) == 0
    assert main(["prepare", "--model-path", str(full), "--out", str(tmp_path / "local"), *common, "--regenerate",
                 "--device", "cpu", "--dtype", "float32", "--regen-engine", "generic"]) == 0
    answers = []
    for split in ("train", "heldout"):
        remote, local = lines(tmp_path / "remote" / f"{split}.jsonl"), lines(tmp_path / "local" / f"{split}.jsonl")
        assert [r["messages"] for r in remote] == [r["messages"] for r in local]
        assert [r["truncated"] for r in remote] == [r["truncated"] for r in local]
        answers += [r["messages"][-1]["content"] for r in remote]
        for part in ("tokens", "mask", "offsets"):
            assert np.array_equal(np.load(tmp_path / "remote" / f"{split}.{part}.npy"),
                                  np.load(tmp_path / "local" / f"{split}.{part}.npy"))
    assert len(answers) == 10 and len(set(answers)) >= 8  # the answers differ: the comparison means something
    meta = json.loads((tmp_path / "remote" / "meta.json").read_text())
    server_meta = meta["regeneration"]["server"]
    assert server_meta["model"] == NAME and meta["splits"]["heldout"]["rows"] > 0
    assert set(server_meta["checked"]) == {"name", "vocab", "template", "prompt tokens"}
    assert len(lines(tmp_path / "remote" / ANSWERS)) == 10


def test_a_server_of_another_model_is_refused_naming_both(chatty, server, tmp_path, capsys):
    src = prompts(tmp_path / "in.jsonl", 2)
    run = ["prepare", "--out", str(tmp_path / "o"), "--input", str(src), "--regenerate-url", server.url,
           "--max-new-tokens", "4", "--held-out", "0"]
    other = config_only(chatty[0], tmp_path / "llama-3-8b-instruct")
    assert main([*run, "--model-path", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"serves '{NAME}'" in err and f"data is for '{other}'" in err
    assert f"--served-model-name {NAME}" in err
    assert not (tmp_path / "o" / ANSWERS).exists()
    # the names differ legitimately: the override is taken, and the vocabulary and template still checked
    assert main([*run, "--model-path", str(other), "--served-model-name", NAME]) == 0
    assert len(lines(tmp_path / "o" / "train.jsonl")) == 2
    wider = config_only(chatty[0], tmp_path / "wider" / NAME, vocab_size=400)
    assert main([*run, "--model-path", str(wider)]) == 2
    err = capsys.readouterr().err
    assert "vocabulary of 320 tokens" in err and "has 400" in err
    assert main([*run, "--model-path", str(chatty[1]), "--served-model-name", "gpt-4"]) == 2
    assert "'gpt-4' is not served" in capsys.readouterr().err


def test_a_server_restart_and_a_killed_client_lose_and_repeat_nothing(chatty, server, tmp_path, capsys):
    n = 20  # 4 answered, the kill, 6 more, the client killed: 10 or so left for the resumed run
    src = prompts(tmp_path / "in.jsonl", n, offset=100)
    out = tmp_path / "out"
    args = ["prepare", "--model-path", str(chatty[1]), "--out", str(out), "--input", str(src), "--temperature", "0",
            "--max-new-tokens", "24", "--held-out", "0", "--regenerate-url", server.url, "--concurrency", "4",
            "--retry-for", "120"]
    log = (tmp_path / "client.err").open("w")
    client = subprocess.Popen([sys.executable, "-m", "eyas", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def wait_for(count: int) -> int:
        end = time.time() + 180
        while len(lines(out / ANSWERS)) < count:
            assert client.poll() is None, (tmp_path / "client.err").read_text()[-3000:]
            assert time.time() < end, "no progress"
            time.sleep(0.05)
        return len(lines(out / ANSWERS))

    try:
        wait_for(4)
        server.kill()  # requests in flight die with it
        at_kill = len(lines(out / ANSWERS))
        time.sleep(1)
        server.start()
        wait_for(at_kill + 6)  # the same client carries on against the new server
        client.send_signal(signal.SIGKILL)  # and is killed mid-run, maybe mid-line
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
        log.close()
    kept = {e["key"] for e in lines(out / ANSWERS)}
    assert at_kill < len(kept) < n, "the client should have been killed mid-run, after the restart"
    before = server.chat_requests()
    assert main(args) == 0
    said = capsys.readouterr().out
    assert f"{len(kept)} prompts answered in an earlier run are taken from" in said
    assert f"; {n - len(kept)} to ask" in said
    assert server.chat_requests() - before == n - len(kept) + 1  # the rest, once each, and the one-token probe
    entries = lines(out / ANSWERS)
    assert len(entries) == len({e["key"] for e in entries}) == n  # none lost, none twice
    rows = lines(out / "train.jsonl")
    asked = sorted(r["messages"][0]["content"] for r in lines(src))
    assert sorted(r["messages"][0]["content"] for r in rows) == asked
    assert all(r["messages"][-1]["role"] == "assistant" and r["messages"][-1]["content"] for r in rows)


# The retry policy, against a fake server that fails on purpose.

def fake_app(fail: dict[str, list[int]], answered: list[str]):
    """An OpenAI-compatible app serving NAME: a prompt whose text is a key of ``fail`` gets those
    statuses first (429 with Retry-After), then an answer; ``answered`` records every 200 but the
    check's probe."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": NAME, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        text = body["messages"][-1]["content"]
        todo = fail.get(text)
        if todo:
            status = todo.pop(0)
            headers = {"Retry-After": "0.3"} if status == 429 else {}
            return JSONResponse({"error": {"message": f"injected {status}"}}, status_code=status, headers=headers)
        if text != PROBE[-1]["content"]:
            answered.append(text)
        return {"choices": [{"message": {"role": "assistant", "content": f"answer to {text}"},
                             "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}

    return app


def _regenerator(url: str, out: Path, **remote) -> RemoteRegenerator:
    tok = byte_tokenizer()
    target = TokenizerTarget(tok, TargetInfo(NAME, 8, 64, 320, 64, 1024))
    return RemoteRegenerator(target, RegenConfig(temperature=0, max_new_tokens=8), RemoteConfig(url, **remote), out,
                             NAME, log=lambda *a: None, progress=False)


def _records(texts):
    return [{"messages": [{"role": "user", "content": t}]} for t in texts]


def test_retries_429_and_5xx_honours_retry_after_and_drops_refused_prompts(tmp_path):
    answered = []
    fail = {"a": [429, 503], "b": [500, 502, 504], "c": [400], "d": [], "e": [429]}
    with InProcessServer(fake_app(fail, answered)) as s:
        regen = _regenerator(s.url, tmp_path, concurrency=2)
        t0 = time.perf_counter()
        got, stats = regen.regenerate(_records("abcde"))
        took = time.perf_counter() - t0
    assert sorted(r["messages"][-1]["content"] for r in got) == [f"answer to {t}" for t in "abde"]
    assert sorted(answered) == ["a", "b", "d", "e"] and stats.prompts == 4 and regen.refused == 1
    assert took >= 0.3  # Retry-After was waited for
    assert len(lines(tmp_path / ANSWERS)) == 4  # the refused prompt is not saved: a rerun asks it again


def test_a_server_that_stays_down_stops_the_run_with_answers_kept(tmp_path):
    answered = []
    with InProcessServer(fake_app({"down": [503] * 1000, "b": [401]}, answered)) as s:
        regen = _regenerator(s.url, tmp_path, retry_for=1.0, concurrency=1)
        regen.regenerate(_records(["a"]))
        with pytest.raises(EyasError, match=r"failed one request for 1 s \(--retry-for\)") as e:
            regen.regenerate(_records(["down"]))
        assert "1 answers saved in" in str(e.value) and "rerun the same command" in str(e.value)
        with pytest.raises(EyasError, match="HTTP 401"):
            regen.regenerate(_records(["b"]))
    assert answered == ["a"]


def test_flags_that_need_a_model_or_a_server_are_refused(tmp_path, capsys):
    base = ["prepare", "--out", str(tmp_path / "o"), "--input", str(prompts(tmp_path / "in.jsonl", 2))]
    assert main([*base, "--regenerate-url", "http://127.0.0.1:9", "--source", "magpie"]) == 2
    assert "source magpie needs the target loaded here" in capsys.readouterr().err
    assert main([*base, "--regenerate", "--served-model-name", NAME]) == 2
    assert "--served-model-name only mean something with --regenerate-url" in capsys.readouterr().err
    assert main([*base, "--regenerate-url", "http://127.0.0.1:9", "--device", "cuda", "--batch-size", "64"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size, --device set how the target runs here" in err and "--concurrency" in err


def test_an_openai_base_url_is_the_servers_root():
    """Users paste the base URL their OpenAI client takes; /v1/v1/chat/completions would be a 404 of ours."""
    from eyas.data.remote import RemoteConfig

    assert RemoteConfig("http://127.0.0.1:30000/v1/").url == RemoteConfig("http://127.0.0.1:30000").url
    assert RemoteConfig("http://127.0.0.1:30000/v1").url == "http://127.0.0.1:30000"
