"""The live doctor against an eyas server that skips speculation because its device's default says so (the CPU):
not the story's misconfiguration, and said so, against one started with --speculative-algorithm NONE."""

from __future__ import annotations

from live_server import LiveServer

from eyas.config import Algorithm, SpecConfig
from eyas.doctor.live import LiveOptions, diagnose_live
from eyas.serve.defaults import SettingChoice, device_default


def test_speculation_off_by_the_cpu_default_is_a_choice_not_a_mistake(target):
    from eyas.engine.engine import Engine

    engine = Engine(target, None, SpecConfig(Algorithm.NONE))
    default = device_default("cpu")
    engine.setting_choice = SettingChoice(default.setting, "default for cpu", default.why)
    with LiveServer(engine) as srv:
        report = diagnose_live(srv.url, LiveOptions(probes=1, max_tokens=8))
    assert report.verdict == "SPECULATION OFF by choice (the default for cpu: plain decoding is faster here)"
    assert report.exit_code == 0 and report.figures["server_setting_source"] == "default for cpu"
    row = next(c for c in report.checks if c.name == "speculation")
    assert row.status == "warning" and "Not a misconfiguration" in row.message and default.why in row.message
    assert "--speculative-algorithm EAGLE3" in row.fix

    engine.setting_choice = SettingChoice("0", "flags", "as the flags say (--speculative-algorithm NONE)")
    with LiveServer(engine) as srv:
        report = diagnose_live(srv.url, LiveOptions(probes=1, max_tokens=8))
    assert report.exit_code == 1 and report.verdict == "SPECULATION OFF: the server decodes without a draft"
