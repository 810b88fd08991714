"""How vLLM, SGLang and TGI serve a bundle: each engine's verdict, merged/ and the commands.

Consumes the assembled bundle (adapter_config.json, the adapter's tensors, the tokenizer), the
base's config.json and the engines' documented limits (arenaflow.bundles.engines); gives
- per engine "adapter", or "merged weights needed" with each reason (rank above the engine's
  --max-lora-rank, modules_to_save, DoRA, added vocabulary, a LoRA target or architecture the
  engine does not document);
- merged/ (the base with the adapter folded in, arenaflow.merge.fold) when an engine needs it or
  the bundle's `merged: always` asks, with the bundle's tokenizer, chat template and generation
  config, checked against base + adapter (check_merged);
- the exact command that serves the bundle as it was evaluated, for each engine and form, to be
  run in the bundle's directory (`paths`: the bundle files it names);
- where vLLM is installed with a CUDA device, its offline LLM API's greedy answers against the
  reload check's (check_vllm); elsewhere the check says it did not run, and why.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from arenaflow import chat, io, models
from arenaflow.bundles.checks import BundleCheckError
from arenaflow.bundles.engines import ENGINES
from arenaflow.merge import fold
from arenaflow.merge.parents import MergeError
from arenaflow.merge.stream import ST_DTYPES

MERGED = "merged"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SERVED_FILES = (*TOKENIZER_FILES, "chat_template.jinja", "generation_config.json")
# logits of the merged model against base + adapter, both in float32: rounding W + dW once to
# the weights' dtype moves each weight by eps/2 of it; 64 eps of the largest logit covers that
# through the layers (measured: 2e-6 relative, ~16 eps, on models/tiny-arith in float32)
LOGIT_EPS = 64


def adapter_facts(bundle: Path, base_model: str) -> dict:
    """What the engines' limits are checked against: the adapter's rank (the largest of r and its
    rank_pattern), targets, modules_to_save, DoRA, the vocabulary it adds, the base's
    architecture and dtype."""
    cfg = io.read_json(bundle / models.ADAPTER_CONFIG)
    base = io.read_json(Path(base_model) / "config.json")
    text = base.get("text_config", base)
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else targets
    with safe_open(str(bundle / models.ADAPTER_WEIGHTS), framework="pt") as f:
        rows = [f.get_slice(k).get_shape()[0] for k in f.keys() if _vocab_tensor(k)]
    vocab = max([len(models.load_tokenizer(bundle)), *rows])
    return {
        "rank": max([cfg["r"], *(cfg.get("rank_pattern") or {}).values()]),
        "target_modules": sorted({t.rsplit(".", 1)[-1] for t in targets}),
        "modules_to_save": sorted(cfg.get("modules_to_save") or []),
        "use_dora": bool(cfg.get("use_dora")),
        "added_tokens": max(0, vocab - text["vocab_size"]),
        "architecture": (base.get("architectures") or ["?"])[0],
        "dtype": str(base.get("dtype") or base.get("torch_dtype") or "auto"),
    }


def _vocab_tensor(key: str) -> bool:
    """A tensor whose first dimension is the vocabulary: a saved head or input embedding."""
    return key.endswith(("lm_head.weight", "embed_tokens.weight"))


def engine_verdict(name: str, facts: dict) -> dict:
    """{verdict, form, reasons, max_lora_rank}: 'adapter' when the engine documents serving this
    adapter as it is, else 'merged weights needed' and each reason, with the page stating it."""
    e, arch = ENGINES[name], facts["architecture"]
    doc = e["docs"]["lora"]
    reasons = []
    allowed = e["lora_targets"].get(arch)
    if allowed is None:
        reasons.append(f"LoRA on {arch} is not documented ({doc}, {e['version']})")
    elif set(facts["target_modules"]) - set(allowed):
        extra = sorted(set(facts["target_modules"]) - set(allowed))
        reasons.append(f"LoRA on {extra} is not served (targets: {allowed}; {doc})")
    if facts["modules_to_save"] and not e["modules_to_save"]:
        reasons.append(
            f"modules_to_save {facts['modules_to_save']} (trained in full) is not loaded "
            f"from an adapter ({e['docs'].get('peft_helper', doc)})"
        )
    if facts["use_dora"] and not e["dora"]:
        reasons.append(f"DoRA adapters are not supported ({doc})")
    if facts["added_tokens"] and not e["added_tokens"]:
        reasons.append(
            f"the adapter adds {facts['added_tokens']} tokens to the vocabulary "
            f"({e['docs'].get('added_tokens', doc)})"
        )
    choices = e["max_lora_rank_choices"]
    rank = facts["rank"]
    if choices and rank > max(choices):
        reasons.append(
            f"rank {rank} is above --max-lora-rank's largest choice {max(choices)} "
            f"({e['docs']['args']})"
        )
    fits = [c for c in choices or [] if c >= rank]
    return {
        "verdict": "merged weights needed" if reasons else "adapter",
        "form": "merged" if reasons else "adapter",
        "reasons": reasons,
        "max_lora_rank": fits[0] if fits else rank,
    }


def engine_dtype(name: str, dtype: str) -> str:
    """The --dtype that serves weights of `dtype`: itself where the engine has it, else bfloat16
    (TGI has no float32)."""
    return dtype if dtype in ENGINES[name]["dtypes"] else "bfloat16"


def adapter_argv(name: str, bundle: str, base: str, facts: dict, v: dict, serving: dict) -> list:
    d = engine_dtype(name, facts["dtype"])
    total = str(serving["max_input_tokens"] + serving["max_new_tokens"])
    lora = f"{bundle}=."
    rank = str(v["max_lora_rank"])
    if name == "vllm":
        return [*ENGINES[name]["launcher"], base, "--enable-lora", "--lora-modules", lora,
                "--max-lora-rank", rank, "--chat-template", "chat_template.jinja",
                "--generation-config", ".", "--dtype", d, "--max-model-len", total]  # fmt: skip
    if name == "sglang":
        return [*ENGINES[name]["launcher"], "--model-path", base, "--enable-lora",
                "--lora-paths", lora, "--max-lora-rank", rank,
                "--lora-target-modules", *facts["target_modules"],
                "--chat-template", "chat_template.jinja", "--dtype", d,
                "--context-length", total]  # fmt: skip
    return [*ENGINES[name]["launcher"], "--model-id", base, "--lora-adapters", lora,
            "--tokenizer-config-path", "tokenizer_config.json", "--dtype", d,
            "--max-input-tokens", str(serving["max_input_tokens"]),
            "--max-total-tokens", total]  # fmt: skip


def model_argv(name: str, bundle: str, model: str, dtype: str, serving: dict) -> list:
    """The command serving a directory of full weights (merged/, or a full fine-tune's bundle)."""
    d = engine_dtype(name, dtype)
    total = str(serving["max_input_tokens"] + serving["max_new_tokens"])
    at = "" if model == "." else f"{model}/"
    if name == "vllm":
        return [*ENGINES[name]["launcher"], model, "--served-model-name", bundle,
                "--chat-template", f"{at}chat_template.jinja", "--generation-config", model,
                "--dtype", d, "--max-model-len", total]  # fmt: skip
    if name == "sglang":
        return [*ENGINES[name]["launcher"], "--model-path", model, "--served-model-name", bundle,
                "--chat-template", f"{at}chat_template.jinja", "--dtype", d,
                "--context-length", total]  # fmt: skip
    return [*ENGINES[name]["launcher"], "--model-id", model,
            "--tokenizer-config-path", f"{at}tokenizer_config.json", "--dtype", d,
            "--max-input-tokens", str(serving["max_input_tokens"]),
            "--max-total-tokens", total]  # fmt: skip


def command(argv: list[str], paths: list[str]) -> dict:
    return {"argv": argv, "command": shlex.join(argv), "paths": paths}


def adapter_paths(name: str) -> list[str]:
    return {
        "vllm": [".", "chat_template.jinja"],
        "sglang": [".", "chat_template.jinja"],
        "tgi": [".", "tokenizer_config.json"],
    }[name]


def model_paths(name: str, model: str) -> list[str]:
    at = "" if model == "." else f"{model}/"
    return [model, f"{at}{'tokenizer_config.json' if name == 'tgi' else 'chat_template.jinja'}"]


def engine_records(bundle: str, base: str, facts: dict | None, merged: bool, serving: dict):
    """{engine: {verdict, form, reasons, the adapter and merged commands it has, use: the key of
    the one to use (None: merged weights needed, but merged/ was not built)}}. facts None: the
    bundle holds full weights, served as they are ("model")."""
    out = {}
    for name, e in ENGINES.items():
        if facts is None:
            cmd = command(model_argv(name, bundle, ".", "auto", serving), model_paths(name, "."))
            out[name] = {"verdict": "full weights", "form": "model", "reasons": [], "model": cmd}
            out[name]["use"] = "model"
            continue
        v = engine_verdict(name, facts)
        rec = {**v, "version": e["version"], "docs": e["docs"]["lora"]}
        if v["form"] == "adapter":
            argv = adapter_argv(name, bundle, base, facts, v, serving)
            rec["adapter"] = command(argv, adapter_paths(name))
        if merged:
            argv = model_argv(name, bundle, MERGED, facts["dtype"], serving)
            rec["merged"] = command(argv, model_paths(name, MERGED))
        rec["use"] = v["form"] if v["form"] in rec else None  # None: merged/ was not built
        if engine_dtype(name, facts["dtype"]) != facts["dtype"] and facts["dtype"] != "auto":
            rec["note"] = f"served in bfloat16: --dtype has no {facts['dtype']}"
        out[name] = rec
    return out


def wants_merged(setting: str, records: dict) -> bool:
    """`merged: always` or `auto` with an engine that needs it (`never`: no merged/)."""
    if setting == "always":
        return True
    return setting == "auto" and any(r["form"] == "merged" for r in records.values())


def write_merged(tmp: Path, base_model: str) -> dict:
    """tmp/merged: the base with tmp's adapter folded in, and the bundle's serving files."""
    try:
        info = fold.fold(tmp, base_model, tmp / MERGED)
    except MergeError as e:
        raise BundleCheckError(f"merged/ cannot be built: {e}") from None
    for f in SERVED_FILES:
        if (tmp / f).exists():
            shutil.copyfile(tmp / f, tmp / MERGED / f)
    return info


@torch.no_grad()
def greedy_ids(model, ids: torch.Tensor, max_new_tokens: int, stops: list[int]) -> list[int]:
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stops,
        pad_token_id=stops[0],
    )
    new = out[0, ids.shape[1] :].tolist()
    stop_at = next((j for j, t in enumerate(new) if t in stops), None)
    return new if stop_at is None else new[: stop_at + 1]


def check_merged(tmp: Path, base_model: str, system_prompt: str, prompts, max_new_tokens) -> dict:
    """merged/ against base + adapter, both in float32: on each check prompt the same greedy
    tokens, and logits along prompt + reply within LOGIT_EPS eps of the weights' dtype of the
    largest logit. Written to merged_check.json; a difference raises BundleCheckError."""
    from peft import PeftModel

    dev = models.device()
    tok = models.load_tokenizer(tmp / MERGED)
    stops = io.read_json(tmp / MERGED / "generation_config.json")["eos_token_id"]
    stops = stops if isinstance(stops, list) else [stops]
    ref = models.from_pretrained(base_model, dtype=torch.float32).to(dev)
    ref = PeftModel.from_pretrained(ref, str(tmp)).eval()
    merged = models.from_pretrained(tmp / MERGED, dtype=torch.float32).to(dev).eval()
    with safe_open(str(next((tmp / MERGED).glob("*.safetensors"))), framework="pt") as f:
        wdtype = ST_DTYPES[f.get_slice(next(iter(f.keys()))).get_dtype()]
    tol_eps = LOGIT_EPS * torch.finfo(wdtype).eps
    rows, ok = [], True
    for p in prompts:
        text = tok.apply_chat_template(
            chat.prompt_messages(system_prompt, p), tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].to(dev)
        a, b = (greedy_ids(m, ids, max_new_tokens, stops) for m in (ref, merged))
        full = torch.cat([ids, torch.tensor([a], device=dev)], dim=1)
        with torch.no_grad():
            la, lb = ref(input_ids=full).logits, merged(input_ids=full).logits
        diff, top = float((la - lb).abs().max()), float(la.abs().max())
        same = a == b and diff <= tol_eps * top
        ok &= same
        rows.append({"prompt": p, "adapter_ids": a, "merged_ids": b, "max_abs_logit_diff": diff,
                     "tolerance": tol_eps * top, "pass": same})  # fmt: skip
    worst = max(r["max_abs_logit_diff"] for r in rows)
    record = {"verdict": "PASS" if ok else "FAIL", "weights_dtype": str(wdtype), "prompts": rows}
    io.write_json(tmp / "merged_check.json", record)
    if not ok:
        bad = [r["prompt"] for r in rows if not r["pass"]]
        raise BundleCheckError(f"merged/ is not base + adapter on {bad} (merged_check.json)")
    return {
        "verdict": "PASS",
        "detail": (
            f"merged/ = base + adapter on {len(rows)} prompts in float32: greedy tokens "
            f"identical, max |logit diff| {worst:.3g} (<= {LOGIT_EPS} eps of {wdtype})"
        ),
    }


def add_serving(tmp: Path, bundle: str, base_model: str, evidence: dict, cfg: dict) -> dict:
    """The engines' verdicts and commands into serving_config.json, merged/ where wanted (and
    checked), the vLLM offline check where vLLM runs; returns their checks. base_model: the base's
    directory here; the commands name the base as the evidence does."""
    from arenaflow import schema
    from arenaflow.bundles import vllm_offline

    setting = cfg.get("merged") or schema.schema_defaults("bundle")["merged"]
    facts = adapter_facts(tmp, base_model) if models.is_adapter(tmp) else None
    base, serving = evidence["base_model"], cfg["serving"]
    records = engine_records(bundle, base, facts, False, serving)
    merged = facts is not None and wants_merged(setting, records)
    checks = {}
    if merged:
        write_merged(tmp, base_model)
        checks["merged"] = check_merged(
            tmp, base_model, cfg["system_prompt"], cfg["reload_prompts"], serving["max_new_tokens"]
        )
        records = engine_records(bundle, base, facts, True, serving)
    checks["serving_engines"] = {
        "verdict": "PASS",
        "detail": "; ".join(f"{n}: {r['verdict']}" for n, r in records.items())
        + " (the reasons and commands: serving_config.json)",
    }
    vllm = vllm_offline.run(tmp, base_model, records["vllm"], cfg["system_prompt"],
                            cfg["reload_prompts"])  # fmt: skip
    if vllm["verdict"] == "FAIL":
        raise BundleCheckError(f"{vllm['detail']}: {vllm['answers']}")
    checks["vllm_offline"] = {k: vllm[k] for k in ("verdict", "detail")}
    sc = io.read_json(tmp / "serving_config.json")
    sc["serving_engines"] = {
        "run_in": "the bundle's directory; the base model as named in base_model",
        "merged_dir": MERGED if merged else None,
        "merged_setting": setting,
        "adapter": facts,
        "engines": records,
    }
    io.write_json(tmp / "serving_config.json", sc)
    return checks
