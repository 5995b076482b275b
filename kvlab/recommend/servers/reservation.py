"""The brief's recipe: not a shipping server. A server that reserves prompt + a percentile of the
output lengths (TGI's rule with the cap set to it), with each overflow mode (recompute, swap to a
4 GiB CPU pool over the host link, reject), next to reserving all of ``max_new_tokens``.

"swap" here is the recipe's (and vLLM V0's) swap; current servers offload KV to the host instead
(vLLM ``--kv-offloading-size``, SGLang's hierarchical cache), offered by their own profiles.
"""
from __future__ import annotations

from dataclasses import replace

from .base import OVERFLOW_MODES, Context, Launch, LaunchContext, ServerProfile, Setting


class Reservation(ServerProfile):
    system = "reservation"
    shipping = False
    key = "reservation"
    family = "no shipping server (the brief's recipe)"
    versions = ((0,), None)
    sources = ("the brief, section 3",)
    overflow = "recompute, swap (4 GiB CPU pool) or reject, one setting each"
    kv_knobs = ("reserve",)
    prefix_cache = "none"
    policy = "reserve_max"

    def defaults(self, ctx: Context) -> dict:
        return {"reserve": "max_new_tokens", "overflow": "recompute"}

    def settings(self, ctx: Context) -> list[Setting]:
        base = self.base(label="reserve max_new_tokens", flags={"reserve": "max_new_tokens"})
        out = [base]
        cap = ctx.max_new_tokens
        for name, tokens in ctx.percentiles.items():
            if cap is not None and tokens >= cap:
                continue
            for mode in OVERFLOW_MODES:
                out.append(replace(base, label=f"reserve {name}, {mode}", knob="reserve", policy="tgi",
                                   policy_params={"cap_tokens": int(tokens)}, preemption_mode=mode,
                                   flags={"reserve": f"{name} = {tokens} tokens", "overflow": mode}))
        return out

    def launch(self, setting: Setting, ctx: LaunchContext) -> Launch:
        cap = setting.output_cap_tokens or ctx.max_new_tokens
        return Launch(text="no server flag: " + ", ".join(f"{k} {val}" for k, val in setting.flags.items())
                      + f"; max_new_tokens {cap}, max_model_len {ctx.max_model_len}")


PROFILE = Reservation()
