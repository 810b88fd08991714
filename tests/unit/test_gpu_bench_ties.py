"""benchmarks/gpu_bench.py's tie-aware greedy check: a bf16 decoder may leave
generate()'s tokens where two logits round past each other, and nowhere else.

The oracle: the same random Llama decoded greedily in float32 and in bf16 by transformers'
generate() itself; wherever the two differ, bf16 rounding chose, so every divergence must score
as a tie. A token planted where the float32 model ranks it last must not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "benchmarks/gpu_bench.py")
gpu_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_bench)

PAD, NEW = 0, 24


def flat_llama() -> LlamaForCausalLM:
    """Two layers, weights scaled down so that the logits are nearly flat: bf16 ties abound."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(0.05)
    return model


def prompts(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of 3-10 tokens (ids 3..255)."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 11, (rows,), generator=g)
    ids = torch.full((rows, 10), PAD)
    mask = torch.zeros((rows, 10), dtype=torch.long)
    for r, n in enumerate(lengths.tolist()):
        ids[r, 10 - n :] = torch.randint(3, 256, (n,), generator=g)
        mask[r, 10 - n :] = 1
    return ids, mask


def greedy(model, ids, mask) -> list[list[int]]:
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD
    )
    return out[:, ids.shape[1] :].tolist()


@torch.no_grad()
def test_divergences_of_float32_and_bf16_greedy_are_ties_and_a_planted_token_is_not():
    exact = flat_llama()
    low = flat_llama().to(torch.bfloat16)
    ids, mask = prompts(24)
    ref = greedy(low, ids, mask)  # what the bf16 model's own generate() picks
    ours = greedy(exact, ids, mask)  # the float32 arg-max
    got = gpu_bench.divergence_ties(low, ids, mask, ours, ref)
    assert got["greedy_diverging_rows"] >= 3  # flat logits: the check is exercised
    assert got["greedy_unexplained_rows"] == 0, got
    assert got["greedy_gap_over_rounding_max"] <= 1.0

    row = next(r for r in range(len(ref)) if gpu_bench.first_difference(ours[r], ref[r]) is None)
    ctx = torch.cat([ids[row][mask[row].bool()], torch.tensor(ref[row][:3])])[None]
    worst = int(exact(ctx).logits[0, -1].argmin())
    planted = [list(r) for r in ref]
    planted[row] = ref[row][:3] + [worst] + ref[row][4:]
    got = gpu_bench.divergence_ties(low, ids, mask, planted, ref)
    assert got["greedy_diverging_rows"] == 1 and got["greedy_unexplained_rows"] == 1
    assert got["greedy_gap_over_rounding_max"] > 1.0


def test_first_difference_is_none_only_for_equal_lists():
    assert gpu_bench.first_difference([5, 6, 1], [5, 6, 1]) is None
    assert gpu_bench.first_difference([5, 6, 1], [5, 7, 8, 1]) == 1


class Uncopyable:
    """Stands for a torch.cuda.CUDAGraph, which a decoder cached on the model holds on a GPU."""

    def __deepcopy__(self, memo):
        raise TypeError("cannot pickle 'CUDAGraph' object")


@torch.no_grad()
def test_tie_check_runs_on_a_model_that_carries_decoders_and_leaves_them_there():
    low = flat_llama().to(torch.bfloat16)
    ids, mask = prompts(4)
    decoders = low.__dict__.setdefault("_arenaflow_decoders", {})
    decoders["graphs"] = Uncopyable()
    ref = greedy(low, ids, mask)
    planted = [r[:1] + [(r[1] + 1) % 256] + r[2:] for r in ref]
    got = gpu_bench.divergence_ties(low, ids, mask, planted, ref)
    assert got["greedy_scored_rows"] == 4
    assert low.__dict__["_arenaflow_decoders"] is decoders  # still cached for the next batch


def _spin(n: int) -> int:
    total = 0
    for i in range(n):  # no call inside: all of it is _spin's own time
        total += i
    return total


def test_host_profile_names_the_function_that_held_the_host():
    """decode_check --host: the function with the most time of its own is the one that spun,
    and it holds most of the call's wall time."""
    got = gpu_bench.host_profile(lambda: (_spin(2_000_000), sum(range(1000))))
    top = got["top_self"][0]
    assert top["function"].endswith("(_spin)") and top["calls"] == 1
    assert 0.5 * got["wall_ms"] <= top["self_ms"] <= got["profiled_ms"] <= got["wall_ms"]
    line = gpu_bench.generation_line(
        {
            "path": "static",
            "batch": 1,
            "tokens_per_s": 1.0,
            "fraction_of_bound": 0.5,
            "bound_tokens_per_s": 2.0,
            "step_ms": 1.0,
            "first_call_s": 1.0,
            "host_profile": got,
        }
    )
    assert f"(_spin) {top['self_ms']:.2f} ms" in line
