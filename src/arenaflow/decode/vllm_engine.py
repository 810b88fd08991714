"""vLLM's offline engine as a job's decoder (engine `decoder: vllm`): candidates and readouts.

The job loads its policy once (load_policy): vllm.LLM over the base, with the arm's adapter as a
LoRARequest where vLLM's documented LoRA limits accept it (arenaflow.servers.fit, the bundle's
own verdict), else over the merged weights (arenaflow.merge.fold) in a temporary directory beside
the job's output; a full fine-tune's directory is loaded as it is. The tokenizer is always the
base's, and vLLM reads the rendered prompts as token ids, so the chat template and the stop
tokens are arenaflow's, never the model directory's (generation_config "vllm": the model's
generation_config.json sets no default).

Each prompt is one request of n = k samples, seeded with seed + index * k: vLLM seeds a request's
j-th sample with its seed + j, so every (prompt, sample) of a call draws from a seed of its own,
and a rerun draws the same ones. Greedy output equals the other engines' up to bf16 ties;
samples come from the same distributions (temperature, top_p, no top_k) through vLLM's own
random streams. vLLM schedules every prompt of a call itself (continuous batching, the prompt's
KV shared by its k samples through prefix caching), so `batch_size` does not apply and no
batch is kept for a resumed job: a job killed part way decodes all of it again.

vLLM 0.26.0 is the release built for torch 2.11.0; `pip install 'arenaflow[vllm]'` on a GPU host.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from arenaflow import manifest, models
from arenaflow.decode import sampling
from arenaflow.servers import fit

INSTALL = (
    "install it on a GPU host with `pip install 'arenaflow[vllm]'` (vLLM 0.26.0, built for "
    "torch 2.11.0; docs/performance.md#engines), or set engine.decoder to static or hf"
)


class VllmMissing(RuntimeError):
    """decoder: vllm in a job where vLLM cannot be imported."""


def unavailable() -> str | None:
    """Why vLLM cannot be imported here, or None."""
    return None if importlib.util.find_spec("vllm") is not None else "No module named 'vllm'"


def require(job: str) -> None:
    """Refuse, naming the job and how to install vLLM, where it cannot be imported."""
    why = unavailable()
    if why:
        raise VllmMissing(f"{job}: engine decoder 'vllm', but vLLM is not importable ({why}); "
                          f"{INSTALL}")  # fmt: skip


def describe(decoder: str, policy=None) -> dict:
    """What a corpus manifest and a readout record of the decoder: its name, and where vLLM
    decoded, its version and how it served the policy (Policy.form: adapter or merged, why)."""
    if decoder != "vllm":
        return {"decoder": decoder}
    form = policy.form if isinstance(policy, Policy) else None
    return {"decoder": decoder, "vllm": importlib.metadata.version("vllm"), "served_as": form}


def request_seed(seed: int, index: int, k: int) -> int:
    """The seed of prompt `index`'s request: vLLM seeds its sample j with this + j."""
    return seed + index * k


def sampling_kwargs(dec, k: int, seed: int, stops: list[int]) -> dict:
    """vllm.SamplingParams' arguments for one prompt's k samples under arenaflow's Decoding
    `dec` (arenaflow.decode.sampling): as Decoding.generate_kwargs, no top_k when sampling,
    and no text from vLLM (arenaflow decodes the token ids with its tokenizer)."""
    kwargs = {
        "n": k,
        "seed": seed,
        "max_tokens": dec.max_new_tokens,
        "stop_token_ids": list(stops),
        "repetition_penalty": dec.repetition_penalty,
        "detokenize": False,
    }
    if dec.temperature <= 0:
        return {**kwargs, "temperature": 0.0}
    return {**kwargs, "temperature": dec.temperature, "top_p": dec.top_p, "top_k": 0}


def choose_form(base_model: str | Path, adapter: str | Path | None) -> dict:
    """{form: base | full | adapter | merged, reasons, max_lora_rank}: how vLLM loads the
    policy. An adapter is served as a LoRARequest where vLLM's documented limits accept it
    (arenaflow.servers.limits), else folded into merged weights, each reason given."""
    if adapter is None:
        return {"form": "base", "reasons": [], "max_lora_rank": None}
    if not models.is_adapter(adapter):
        return {"form": "full", "reasons": [], "max_lora_rank": None}
    v = fit.engine_verdict("vllm", fit.adapter_facts(Path(adapter), str(base_model), base_model))
    rank = v["max_lora_rank"] if v["form"] == "adapter" else None
    return {"form": v["form"], "reasons": v["reasons"], "max_lora_rank": rank}


@dataclass
class Policy:
    """A job's vLLM engine: the LLM, the LoRARequest it serves (None: plain weights), how the
    policy was loaded, and the temporary directory of merged weights it owns."""

    llm: object
    lora: object | None
    form: dict
    merged: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def samples(self, tokenizer, prompt_ids: list[list[int]], dec, k: int, seed: int):
        """k samples of each prompt (token ids), as sampling.generate returns them."""
        stops = sampling.stop_token_ids(tokenizer)
        new = decode(self, prompt_ids, dec, k, seed, stops)
        return [[sampling._sample(tokenizer, ids, stops) for ids in rows] for rows in new]

    def generate(self, tokenizer, prompts: list[str], dec, k: int, seed: int, desc: str):
        """sampling.generate's engine "vllm": rendered prompts in, k samples of each out."""
        t0 = time.time()
        rows = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        out = self.samples(tokenizer, rows, dec, k, seed)
        tokens = sum(s["n_tokens"] for row in out for s in row)
        sampling.progress(desc, len(out), len(prompts), k, tokens, time.time() - t0)
        return out


def load_policy(
    base_model: str, adapter: str | None, consumer: str, job: str, chat_template: str | None = None
):
    """(Policy, the base's tokenizer carrying `chat_template`) for `job`, once per job (the LLM
    takes seconds to build): the adapter's directory verified against its manifest first, as
    models.load_policy does. A template that added tokens to the base's vocabulary (ChatML
    installed on a base without it) is refused: vLLM would read the base's smaller embeddings."""
    require(job)
    tok = models.load_tokenizer(base_model, chat_template)
    if len(tok) > len(models.load_tokenizer(base_model)):
        raise ValueError(
            f"{job}: engine decoder 'vllm' with base.chat_template {chat_template!r}, which adds "
            f"tokens to {base_model}'s vocabulary; decode with the static or hf decoder"
        )
    if adapter is not None:
        manifest.require(adapter, consumer)
    form = choose_form(base_model, adapter)
    merged, lora = None, None
    model = {"base": base_model, "full": adapter, "adapter": base_model}.get(form["form"])
    if form["form"] == "merged":
        from arenaflow.merge import fold

        Path(job).parent.mkdir(parents=True, exist_ok=True)
        merged = tempfile.TemporaryDirectory(prefix=".vllm-merged.", dir=Path(job).parent)
        model = str(Path(merged.name) / "model")
        fold.fold(adapter, base_model, model)
    if form["form"] == "adapter":
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(lora_name="policy", lora_int_id=1, lora_path=str(adapter))
    llm = build_llm(model, base_model, form["max_lora_rank"])
    return Policy(llm, lora, form, merged), tok


def build_llm(model: str | Path, tokenizer: str | Path, max_lora_rank: int | None):
    """vllm.LLM over `model`'s weights with `tokenizer`, in the dtype the other engines decode
    in on this device; LoRA enabled up to `max_lora_rank` where given."""
    from vllm import LLM

    # vLLM forks its engine core unless told otherwise, and a forked child cannot use CUDA once
    # this process has touched it (device checks, the static engine in the same process)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    dtype = str(models.dtype_for(models.device())).removeprefix("torch.")
    lora = {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": 1}
    return LLM(model=str(model), tokenizer=str(tokenizer), dtype=dtype, seed=0,
               generation_config="vllm", **(lora if max_lora_rank else {}))  # fmt: skip


def completion_ids(completion, stops: list[int]) -> list[int]:
    """A vLLM completion's new token ids, its stop token last where it stopped on one (vLLM
    keeps it; should a release drop it, its stop_reason puts it back, so that `stopped` and
    `n_tokens` count as the other engines count)."""
    ids = list(completion.token_ids)
    ended = completion.finish_reason == "stop" and isinstance(completion.stop_reason, int)
    if ended and not (ids and ids[-1] in stops):
        ids.append(completion.stop_reason)
    return ids


def decode(policy: Policy, prompt_ids: list[list[int]], dec, k: int, seed: int, stops):
    """The new token ids of `k` samples of each prompt (token ids), prompt-major."""
    from vllm import SamplingParams

    params = [
        SamplingParams(**sampling_kwargs(dec, k, request_seed(seed, i, k), stops))
        for i in range(len(prompt_ids))
    ]
    prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
    outs = policy.llm.generate(prompts, params, use_tqdm=False, lora_request=policy.lora)
    return [
        [completion_ids(c, stops) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs
    ]


_policies: dict = {}


def generate(model_dir, adapter_dir, prompt_ids: list[list[int]], dec, k: int, seed: int):
    """k samples of each prompt (token ids) as arenaflow.decode.sampling.generate gives them
    ({text, n_tokens, stopped}), the policy loaded once per process: for benchmarks."""
    key = (str(model_dir), None if adapter_dir is None else str(adapter_dir))
    if key not in _policies:
        out = Path(tempfile.gettempdir()) / "vllm-benchmark"
        _policies[key] = load_policy(*key, consumer="a benchmark", job=str(out))
    policy, tok = _policies[key]
    return policy.samples(tok, prompt_ids, dec, k, seed)
