"""The speculative setting ``eyas serve`` runs when the command line names none: one per device.

The rule, in order (the user's flags always win):

1. a tree (``--speculative-num-steps/-eagle-topk/-num-draft-tokens``, vLLM's ``--speculative-config``) or a
   ``--speculative-batch-schedule``: exactly that;
2. ``--speculative-algorithm`` or ``--speculative-draft-model-path`` without a tree: adaptive speculation
   (``auto``), which may run no speculation on a step that does not pay;
3. no speculative flag at all: ``DEVICE_DEFAULTS`` for the device in use (``cuda``, ``cpu``; any other
   device takes ``auto``) with the draft shipped for the target; no speculation for a target none ships for
   (the banner says so, rather than ``auto`` over no draft).

The choice, with its reason, is printed in the banner and returned by ``/get_server_info``
(``setting_source``, ``setting_reason``), so ``eyas doctor`` can tell a server that skips speculation
because it does not pay on its device from one that was started without it by mistake.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..common.draft_registry import default_draft_for
from ..config import AUTO
from ..speculative_config import from_vllm


@dataclass(frozen=True)
class DeviceDefault:
    setting: str  # AUTO, "0" (no speculation: the draft is not loaded) or a tree "STEPS,TOPK,TOKENS"
    why: str


# What measured best for a chat workload at one client, per device (issue 31).
DEVICE_DEFAULTS = {
    # H200 (issue 31, served, 80 human-written chat prompts, greedy): the tree 6/8/32 gave 1.51x over no
    # speculation where the chain 5/1/6 gave 1.26x. ``auto`` has 6/8/32 among its candidates, times every
    # candidate's step at warm-up, and moves to chains or to no speculation as the batch grows (a fixed big
    # tree fell to 0.33x at 8 clients: benchmarks/results/serve-gpu-smollm2/summary.txt).
    "cuda": DeviceDefault(AUTO, "the default on CUDA: adaptive, the tree 6/8/32 measured best for chat at one "
                                "client on the H200 (1.51x vs 1.26x for the chain 5/1/6)"),
    # The 2-core CPU (benchmarks/results/cpu-default-smollm2.json, draft v8, medians, settings side by side): no
    # setting pays. A chain's step costs 1.9-2.2x a plain one there, a tree's 2.8-4.0x (verifying 6 tokens alone
    # costs 1.6x one; each draft forward runs eagerly); the draft accepts 1.6 tokens a step on chat with a chain and
    # 2.2-2.3 with a tree: 0.60-0.84x. auto ran 0.82x. Plain decoding is the fastest.
    "cpu": DeviceDefault("0", "the default on the CPU: speculation measured slower than plain decoding there "
                              "(benchmarks/results/cpu-default-smollm2.json)"),
}
OTHER = DeviceDefault(AUTO, "the default without a measured setting for this device: adaptive")

TREE_FLAGS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
              "speculative_batch_schedule")
CHOICE_FLAGS = ("speculative_algorithm", "speculative_draft_model_path", "speculative_config")


@dataclass(frozen=True)
class SettingChoice:
    setting: str  # AUTO, "0", a tree "STEPS,TOPK,TOKENS", or a schedule, as the flags spell them
    source: str  # "flags" or "default for DEVICE"
    why: str

    def line(self) -> str:
        """The banner's line: what runs, and why."""
        what = {AUTO: "auto (adaptive)", "0": "no speculation (plain decoding)"}.get(self.setting, self.setting)
        return f"speculative setting: {what}, {self.why}"


def device_default(device_type: str) -> DeviceDefault:
    return DEVICE_DEFAULTS.get(device_type, OTHER)


def choose_setting(args, engine_args) -> SettingChoice:
    """The setting for parsed ``eyas serve`` flags (``args``) and their ``EngineArgs`` (the device resolved,
    vLLM's --speculative-config merged)."""
    e = engine_args
    if (e.speculative_algorithm or "").upper() == "NONE":
        return SettingChoice("0", "flags", "as the flags say (--speculative-algorithm NONE)")
    vllm = from_vllm(args.speculative_config) if getattr(args, "speculative_config", None) else {}
    if any(getattr(args, name, None) is not None or name in vllm for name in TREE_FLAGS):
        setting = e.speculative_batch_schedule or \
            f"{e.speculative_num_steps},{e.speculative_eagle_topk},{e.speculative_num_draft_tokens}"
        setting = AUTO if setting.strip().lower() == AUTO else setting
        return SettingChoice(setting, "flags", "as the flags say")
    if any(getattr(args, name, None) is not None for name in CHOICE_FLAGS):
        return SettingChoice(AUTO, "flags", "adaptive: the flags ask for speculation but name no tree")
    device = str(e.device).split(":")[0]
    default = device_default(device)
    if default.setting != "0" and default_draft_for(args.model_path) is None:  # auto without a draft: plain steps
        return SettingChoice("0", f"default for {device}", "no draft ships with eyas for this target; "
                             "--speculative-draft-model-path DRAFT speculates (adaptive)")
    how = ("--speculative-algorithm EAGLE3 speculates anyway (adaptive), a tree flag with that setting"
           if default.setting == "0" else "a tree flag or --speculative-batch-schedule overrides it")
    return SettingChoice(default.setting, f"default for {device}", f"{default.why}; {how}")


def apply_choice(engine_args, choice: SettingChoice):
    """``EngineArgs`` running ``choice``: the flags' own settings pass through unchanged."""
    if choice.setting == AUTO:
        return replace(engine_args, speculative_batch_schedule=AUTO)
    if choice.source == "flags":
        return engine_args
    if choice.setting == "0":
        return replace(engine_args, speculative_algorithm="NONE", speculative_draft_model_path=None)
    steps, topk, tokens = (int(x) for x in choice.setting.split(","))
    return replace(engine_args, speculative_num_steps=steps, speculative_eagle_topk=topk,
                   speculative_num_draft_tokens=tokens)
