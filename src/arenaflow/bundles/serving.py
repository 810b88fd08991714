"""How vLLM, SGLang and TGI serve a bundle: each engine's verdict, merged/ and the commands.

Consumes the assembled bundle (adapter_config.json, the adapter's tensors, the tokenizer), the
base's config.json and the engines' documented limits (arenaflow.servers.limits); gives
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
from arenaflow.merge import fold
from arenaflow.merge.parents import MergeError
from arenaflow.merge.stream import ST_DTYPES
from arenaflow.servers.fit import adapter_facts, engine_verdict
from arenaflow.servers.limits import ENGINES

MERGED = "merged"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SERVED_FILES = (*TOKENIZER_FILES, "chat_template.jinja", "generation_config.json")
# logits of the merged model against base + adapter, both in float32: rounding W + dW once to
# the weights' dtype moves each weight by eps/2 of it; 64 eps of the largest logit covers that
# through the layers (measured: 2e-6 relative, ~16 eps, on models/tiny-arith in float32)
LOGIT_EPS = 64


def engine_dtype(name: str, dtype: str, lora: bool = False) -> str:
    """The --dtype that serves weights of `dtype` (with `lora`, under an adapter): itself where
    the engine has it, else bfloat16 (TGI has no float32; vLLM's LoRA kernels take float16 and
    bfloat16 only)."""
    e = ENGINES[name]
    return dtype if dtype in ((lora and e["lora_dtypes"]) or e["dtypes"]) else "bfloat16"


def adapter_argv(name: str, bundle: str, base: str, facts: dict, v: dict, serving: dict) -> list:
    d = engine_dtype(name, facts["dtype"], lora=True)
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
        note = dtype_note(name, facts["dtype"], rec["use"] == "adapter")
        if note:
            rec["note"] = note
        out[name] = rec
    return out


def dtype_note(name: str, dtype: str, lora: bool) -> str | None:
    """Why the command in use serves weights of `dtype` in bfloat16, if it does."""
    if dtype == "auto" or engine_dtype(name, dtype, lora) == dtype:
        return None
    e = ENGINES[name]
    if engine_dtype(name, dtype) == dtype:
        why = f"{e['version']}'s LoRA kernels take no {dtype}"
        return f"served in bfloat16: {why} ({e['docs']['lora_dtypes']})"
    return f"served in bfloat16: --dtype has no {dtype}"


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
    rows, n_tok = info["grown_vocab_size"], len(models.load_tokenizer(tmp / MERGED))
    if rows is not None and rows != n_tok:
        raise BundleCheckError(f"merged/ has {rows} vocabulary rows, its tokenizer {n_tok} tokens")
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
    ref = models.fit_embeddings(models.from_pretrained(base_model, dtype=torch.float32), tok)
    ref = ref.to(dev)
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
