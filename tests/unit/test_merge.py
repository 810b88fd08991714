"""arenaflow.merge.build: weight-space merges of LoRA adapters and full weights.

Every check is against an independent computation on the tiny Llama at models/tiny-arith:
the parents loaded through PEFT / transformers and merged with merge_and_unload, or dense
deltas computed with torch.linalg, never against arenaflow.merge's own arithmetic.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from arenaflow import manifest
from arenaflow.merge import build as M
from arenaflow.merge.lora import pattern_key, peft_targets
from arenaflow.merge.parents import FULL_INDEX, MergeError

pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

TOL = 1e-6


@pytest.fixture(scope="module")
def base(repo_root):
    return str(repo_root / "models/tiny-arith")


def load_base(base_path):
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    return model.eval()


def make_adapter(base_path, d, seed, r=4, targets=("q_proj", "v_proj"), head=False, **lora):
    """A LoRA adapter with non-zero random factors (and a perturbed lm_head when head=True),
    saved by PEFT with a manifest, as a training run leaves it."""
    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=r,
        lora_alpha=lora.pop("lora_alpha", 2 * r),
        target_modules=list(targets),
        modules_to_save=["lm_head"] if head else None,
        init_lora_weights=False,
        **lora,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT's note on a tied head in modules_to_save
        model = get_peft_model(load_base(base_path), cfg)
    with torch.no_grad():  # deltas of a trained adapter's size, not init_lora_weights=False's
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.05)
            if "modules_to_save" in name:
                p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(str(d))
    manifest.write(d, extra={"arm": d.name})
    return d


def make_full(base_path, d, seed, scale=0.02):
    """Full weights: the base with every parameter perturbed, saved by transformers."""
    torch.manual_seed(seed)
    model = load_base(base_path)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    model.save_pretrained(str(d))
    manifest.write(d, extra={"arm": d.name})
    return d


def peft_model(base_path, d):
    """PeftModel.from_pretrained, as a server loads an adapter; any missing or unexpected
    adapter key (a target_modules matching a module the file lacks) fails the test."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(load_base(base_path), str(d))
    bad = [str(w.message) for w in caught if "adapter keys" in str(w.message)]
    assert not bad, bad
    # and no tensor of the file is left out (PEFT ignores a key that no module takes)
    with safe_open(str(d / "adapter_model.safetensors"), "pt") as f:
        in_file = {
            k.removesuffix(".lora_A.weight") for k in f.keys() if k.endswith(".lora_A.weight")
        }
    adapted = {n for n, m in model.named_modules() if "default" in getattr(m, "lora_A", {})}
    assert adapted == in_file
    return model.eval()


def merged_state(base_path, d):
    return {
        k: v.clone() for k, v in peft_model(base_path, d).merge_and_unload().state_dict().items()
    }


IDS = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def assert_states_close(got, want, tol=TOL):
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(
            got[k], want[k], atol=tol, rtol=tol, msg=lambda m, k=k: f"{k}: {m}"
        )


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {
        "A": make_adapter(base, root / "A", 1, r=4, targets=("q_proj", "v_proj")),
        "B": make_adapter(base, root / "B", 2, r=8, targets=("q_proj", "down_proj")),
        "H1": make_adapter(base, root / "H1", 3, r=4, head=True),
        "H2": make_adapter(base, root / "H2", 4, r=2, targets=("k_proj",), head=True),
        "RS": make_adapter(
            base,
            root / "RS",
            5,
            r=8,
            targets=("q_proj", "o_proj", "up_proj"),
            use_rslora=True,
            rank_pattern={"o_proj": 2},
            alpha_pattern={"up_proj": 5},
        ),
    }


# ---------------------------------------------------------------- 1. one parent


@pytest.mark.parametrize("name", ["A", "H1"])
def test_one_adapter_at_weight_one_reproduces_its_logits(base, adapters, tmp_path, name):
    # lora_alpha / r = 2 here, so folding the scaling into B is exact, and so are the logits
    ev = M.merge([(name, str(adapters[name]), 1.0)], base, tmp_path / "one", "one")
    want = logits(peft_model(base, adapters[name]))
    got = logits(peft_model(base, tmp_path / "one"))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    cfg = json.loads((tmp_path / "one" / "adapter_config.json").read_text())
    assert cfg["r"] == cfg["lora_alpha"] == ev["rank"] and not cfg["use_rslora"]
    assert cfg["rank_pattern"] == {} and cfg["alpha_pattern"] == {}


def test_one_rslora_adapter_with_patterns_reproduces_its_weights(base, adapters, tmp_path):
    """rsLoRA with rank_pattern and alpha_pattern: scalings 16/sqrt(8), 4/sqrt(2), 5/sqrt(8).
    Folded into B they round once in float32, so the merged weights agree to float32 and the
    logits as closely as PEFT's own merge_and_unload agrees with the unmerged parent
    (~1e-5 on this model's logits, which reach ~17)."""
    M.merge([("RS", str(adapters["RS"]), 1.0)], base, tmp_path / "one", "one")
    assert_states_close(merged_state(base, tmp_path / "one"), merged_state(base, adapters["RS"]))
    parent = peft_model(base, adapters["RS"])
    want = logits(parent)
    peft_noise = (logits(parent.merge_and_unload()) - want).abs().max().item()
    assert (logits(peft_model(base, tmp_path / "one")) - want).abs().max().item() <= max(
        TOL, 2 * peft_noise
    )
    # a wrong scaling for one module pattern would be far outside that
    assert peft_noise < 1e-4


def test_evidence_and_manifest(base, adapters, tmp_path):
    ev = M.merge(
        [("A", str(adapters["A"]), 0.25), ("B", str(adapters["B"]), 0.75)],
        base,
        tmp_path / "soup",
        "soup",
    )
    out = tmp_path / "soup"
    rec = manifest.require(out, "test")
    assert rec["arm"] == "soup" and rec["kind"] == "merge"
    assert rec["params"]["weights"] == {"A": 0.25, "B": 0.75} and rec["params"]["rank"] is None
    on_disk = json.loads((out / M.EVIDENCE).read_text())
    assert on_disk == json.loads(json.dumps(ev))
    assert ev["method"] == "linear" and ev["output"] == "adapter"
    assert ev["representation"] == "concatenated rank 12" and ev["rank"] == 12
    assert ev["reconstruction_error"] is None and ev["base_model"] == base
    assert ev["bytes_read"] > 0 and ev["bytes_written"] > 0 and ev["wall_time_s"] > 0
    assert ev["code"]["arenaflow"]
    for p, arm in zip(ev["parents"], ["A", "B"]):
        prec = manifest.verify(adapters[arm])
        assert (
            p["arm"] == arm
            and p["dir"] == str(adapters[arm])
            and p["manifest_digest"] == prec["digest"]
        )
        assert (
            p["files_sha256"]["adapter_model.safetensors"]
            == prec["files"]["adapter_model.safetensors"]["sha256"]
        )
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "manifest.json",
        "merge_evidence.json",
    ]


# ---------------------------------------------------------------- 2. dose line


def test_dose_endpoints_reproduce_from_and_to(base, adapters, tmp_path):
    frm, to = ("A", str(adapters["A"])), ("B", str(adapters["B"]))
    for alpha, want in ((0.0, "A"), (1.0, "B")):
        out = tmp_path / f"x{alpha}"
        ev = M.merge(M.dose(frm, to, alpha), base, out, f"x{alpha}")
        assert ev["dropped_zero_weight"] == ["B" if alpha == 0 else "A"]
        torch.testing.assert_close(
            logits(peft_model(base, out)),
            logits(peft_model(base, adapters[want])),
            atol=TOL,
            rtol=0,
        )


def test_dose_beyond_to_extrapolates(base, adapters, tmp_path):
    M.merge(
        M.dose(("A", str(adapters["A"])), ("RS", str(adapters["RS"])), 1.5),
        base,
        tmp_path / "x",
        "x",
    )
    frm, to = merged_state(base, adapters["A"]), merged_state(base, adapters["RS"])
    want = {k: frm[k] + 1.5 * (to[k] - frm[k]) for k in frm}
    assert_states_close(merged_state(base, tmp_path / "x"), want)


# ---------------------------------------------------------------- 3. soups of different adapters


def factors(d, module):
    t = load_file(str(d / "adapter_model.safetensors"))
    key = f"base_model.model.{module}"
    return t[f"{key}.lora_A.weight"], t[f"{key}.lora_B.weight"]


def test_soup_of_different_ranks_and_targets_is_the_average_model(base, adapters, tmp_path):
    ev = M.merge(
        [("A", str(adapters["A"]), 0.5), ("B", str(adapters["B"]), 0.5)], base, tmp_path / "s", "s"
    )
    a, b = merged_state(base, adapters["A"]), merged_state(base, adapters["B"])
    assert_states_close(merged_state(base, tmp_path / "s"), {k: (a[k] + b[k]) / 2 for k in a})
    cfg = json.loads((tmp_path / "s" / "adapter_config.json").read_text())
    assert cfg["target_modules"] == ["down_proj", "q_proj", "v_proj"] and ev["rank"] == 4 + 8

    # The same soup by averaging the (zero-padded) A and B matrices: its cross terms B_A A_B
    # are far from the soup, so the equality above is no accident of small deltas.
    module = "model.layers.0.self_attn.q_proj"
    (a1, b1), (a2, b2) = factors(adapters["A"], module), factors(adapters["B"], module)
    s1, s2 = 8 / 4, 16 / 8  # lora_alpha / r of each
    pad = lambda t, n, dim: torch.cat([t, torch.zeros_like(t).narrow(dim, 0, n)], dim)  # noqa: E731
    a1p, b1p = pad(a1, 4, 0), pad(b1, 4, 1)
    soup = 0.5 * s1 * b1 @ a1 + 0.5 * s2 * b2 @ a2
    naive = (0.5 * (s1 * b1p + s2 * b2)) @ (0.5 * (a1p + a2))
    am, bm = factors(tmp_path / "s", module)
    torch.testing.assert_close(bm @ am, soup, atol=TOL, rtol=TOL)
    assert torch.linalg.norm(naive - soup) / torch.linalg.norm(soup) > 0.3


def test_union_targets_narrowed_by_a_layer_subset_fall_back_to_exact_names(
    base, adapters, tmp_path
):
    one = make_adapter(base, tmp_path / "L0", 7, r=2, targets=("k_proj",), layers_to_transform=[0])
    M.merge([("L0", str(one), 0.5), ("A", str(adapters["A"]), 0.5)], base, tmp_path / "s", "s")
    cfg = json.loads((tmp_path / "s" / "adapter_config.json").read_text())
    assert "model.layers.0.self_attn.k_proj" in cfg["target_modules"]
    assert not any(t.startswith("model.layers.1.self_attn.k") for t in cfg["target_modules"])
    assert cfg["layers_to_transform"] is None
    a, b = merged_state(base, one), merged_state(base, adapters["A"])
    assert_states_close(merged_state(base, tmp_path / "s"), {k: (a[k] + b[k]) / 2 for k in a})


def test_embedding_lora_merges_with_its_transposed_factors(base, adapters, tmp_path):
    """PEFT stores an Embedding's factors as lora_embedding_A (r x vocab), lora_embedding_B
    (hidden x r) and applies (B A)^T: the concatenation is the same, the base-shape check
    transposed."""
    emb = make_adapter(base, tmp_path / "E", 8, r=4, targets=("embed_tokens", "q_proj"))
    M.merge([("E", str(emb), 0.5), ("A", str(adapters["A"]), 0.5)], base, tmp_path / "s", "s")
    with safe_open(str(tmp_path / "s" / "adapter_model.safetensors"), "pt") as f:
        assert f.get_slice("base_model.model.model.embed_tokens.lora_embedding_A").get_shape() == [
            8,
            259,
        ]
    e, a = merged_state(base, emb), merged_state(base, adapters["A"])
    assert_states_close(merged_state(base, tmp_path / "s"), {k: (e[k] + a[k]) / 2 for k in e})


def test_bf16_parents_give_a_bf16_adapter(base, adapters, tmp_path):
    torch.manual_seed(0)
    model = get_peft_model(
        load_base(base).to(torch.bfloat16),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], init_lora_weights=False),
        autocast_adapter_dtype=False,
    )
    model.save_pretrained(str(tmp_path / "P"))
    manifest.write(tmp_path / "P")
    M.merge(
        [("P", str(tmp_path / "P"), 0.5), ("A", str(adapters["A"]), 0.5)], base, tmp_path / "o", "o"
    )
    dtypes = {}
    for d in ("P", "o"):
        with safe_open(str(tmp_path / d / "adapter_model.safetensors"), "pt") as f:
            dtypes[d] = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert set(dtypes["P"].values()) == {"BF16"}
    # a module's dtype is that of its first parent: P's q_proj, A's (float32) v_proj
    assert {k: v for k, v in dtypes["o"].items() if "q_proj" in k} == {
        k: "BF16" for k in dtypes["P"]
    }
    assert {v for k, v in dtypes["o"].items() if "v_proj" in k} == {"F32"}


# ---------------------------------------------------------------- 4. modules_to_save


def head(d):
    return load_file(str(d / "adapter_model.safetensors"))["base_model.model.lm_head.weight"]


def test_soup_of_two_heads_is_the_average_head(base, adapters, tmp_path):
    ev = M.merge(
        [("H1", str(adapters["H1"]), 0.5), ("H2", str(adapters["H2"]), 0.5)],
        base,
        tmp_path / "s",
        "s",
    )
    want = (head(adapters["H1"]) + head(adapters["H2"])) / 2
    torch.testing.assert_close(head(tmp_path / "s"), want, atol=TOL, rtol=0)
    h1, h2 = merged_state(base, adapters["H1"]), merged_state(base, adapters["H2"])
    assert_states_close(merged_state(base, tmp_path / "s"), {k: (h1[k] + h2[k]) / 2 for k in h1})
    lora_bytes = sum(
        4 * math.prod(t.shape)
        for d in ("H1", "H2")
        for k, t in load_file(str(adapters[d] / "adapter_model.safetensors")).items()
    )
    assert ev["bytes_read"] == lora_bytes  # the weights sum to 1: the base is not read


def test_a_parent_without_the_head_contributes_the_base_head(base, adapters, tmp_path):
    M.merge(
        [("H1", str(adapters["H1"]), 0.5), ("A", str(adapters["A"]), 0.5)],
        base,
        tmp_path / "s",
        "s",
    )
    emb = load_file(f"{base}/model.safetensors")[
        "model.embed_tokens.weight"
    ]  # the base ties its head
    torch.testing.assert_close(
        head(tmp_path / "s"), 0.5 * head(adapters["H1"]) + 0.5 * emb, atol=TOL, rtol=0
    )
    h, a = merged_state(base, adapters["H1"]), merged_state(base, adapters["A"])
    assert_states_close(merged_state(base, tmp_path / "s"), {k: (h[k] + a[k]) / 2 for k in h})


# ---------------------------------------------------------------- 5. truncated SVD


def has_module(d, module):
    with safe_open(str(d / "adapter_model.safetensors"), "pt") as f:
        return f"base_model.model.{module}.lora_A.weight" in f.keys()


def dense_delta(d, module, scale=1.0):
    a, b = factors(d, module)
    return scale * b @ a


def test_svd_records_the_measured_reconstruction_error(base, adapters, tmp_path):
    parents = [("A", str(adapters["A"]), 0.5), ("B", str(adapters["B"]), 0.5)]
    ev = M.merge(parents, base, tmp_path / "k3", "k3", rank=3)
    assert ev["rank"] == 3 and ev["representation"] == "svd rank 3"
    per = ev["reconstruction_error"]["per_module"]
    assert ev["reconstruction_error"]["max_rel_fro"] == max(per.values())
    modules = {
        k.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        for arm in ("A", "B")
        for k in load_file(str(adapters[arm] / "adapter_model.safetensors"))
        if k.endswith(".lora_A.weight")
    }
    assert set(per) == modules
    out = load_file(str(tmp_path / "k3" / "adapter_model.safetensors"))
    for module in modules:
        # both parents have lora_alpha / r = 2, and weight 0.5; a parent without the module adds 0
        want = sum(
            dense_delta(adapters[arm], module, 0.5 * 2.0)
            for arm in ("A", "B")
            if has_module(adapters[arm], module)
        )
        a3, b3 = (
            out[f"base_model.model.{module}.lora_A.weight"],
            out[f"base_model.model.{module}.lora_B.weight"],
        )
        assert a3.shape[0] == b3.shape[1] == 3
        measured = (torch.linalg.norm(want - b3 @ a3) / torch.linalg.norm(want)).item()
        assert per[module] == pytest.approx(measured, rel=1e-4, abs=1e-6)
        best = torch.linalg.svdvals(want)  # Eckart-Young: the optimum's error, computed densely
        assert measured == pytest.approx(
            (best[3:].square().sum() / best.square().sum()).sqrt().item(), rel=1e-4
        )
    assert ev["reconstruction_error"]["max_rel_fro"] > 0.05


def test_svd_at_full_rank_is_exact(base, adapters, tmp_path):
    parents = [("A", str(adapters["A"]), 0.5), ("B", str(adapters["B"]), 0.5)]
    ev = M.merge(parents, base, tmp_path / "k12", "k12", rank=12)
    assert ev["reconstruction_error"]["max_rel_fro"] < 1e-5
    a, b = merged_state(base, adapters["A"]), merged_state(base, adapters["B"])
    assert_states_close(
        merged_state(base, tmp_path / "k12"), {k: (a[k] + b[k]) / 2 for k in a}, tol=1e-5
    )


# ---------------------------------------------------------------- 6. full weights


@pytest.fixture(scope="module")
def fulls(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    return {n: make_full(base, root / n, seed) for n, seed in (("F1", 1), ("F2", 2))}


def test_full_soup_is_the_average_state_dict(base, fulls, tmp_path):
    ev = M.merge(
        [("F1", str(fulls["F1"]), 0.5), ("F2", str(fulls["F2"]), 0.5)], base, tmp_path / "s", "s"
    )
    assert ev["output"] == "full" and ev["rank"] is None
    f1, f2 = (load_file(str(fulls[n] / "model.safetensors")) for n in ("F1", "F2"))
    got = load_file(str(tmp_path / "s" / "model.safetensors"))
    assert_states_close(got, {k: (f1[k] + f2[k]) / 2 for k in f1})
    assert (tmp_path / "s" / "config.json").read_text() == (fulls["F1"] / "config.json").read_text()


def test_full_weights_not_summing_to_one_read_the_base(base, fulls, tmp_path):
    ev = M.merge(
        [("F1", str(fulls["F1"]), 1.0), ("F2", str(fulls["F2"]), 0.5)], base, tmp_path / "s", "s"
    )
    b = load_file(f"{base}/model.safetensors")
    f1, f2 = (load_file(str(fulls[n] / "model.safetensors")) for n in ("F1", "F2"))
    want = {k: b[k] + 1.0 * (f1[k] - b[k]) + 0.5 * (f2[k] - b[k]) for k in f1}
    assert_states_close(load_file(str(tmp_path / "s" / "model.safetensors")), want)
    assert ev["bytes_read"] == 3 * sum(4 * t.numel() for t in f1.values())


def test_full_merge_shards_and_reloads(base, fulls, tmp_path):
    out = tmp_path / "s"
    M.merge(
        [("F1", str(fulls["F1"]), 0.3), ("F2", str(fulls["F2"]), 0.7)],
        base,
        out,
        "s",
        shard_bytes=300_000,
    )
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 3 and not (out / "model.safetensors").exists()
    index = json.loads((out / FULL_INDEX).read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    f1, f2 = (load_base(str(fulls[n])) for n in ("F1", "F2"))
    torch.testing.assert_close(
        model.model.norm.weight, 0.3 * f1.model.norm.weight + 0.7 * f2.model.norm.weight
    )
    s1, s2 = f1.state_dict(), f2.state_dict()
    assert_states_close(model.state_dict(), {k: 0.3 * s1[k] + 0.7 * s2[k] for k in s1})
    logits(model)  # and it runs


# ---------------------------------------------------------------- 7. refusals


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_a_parent_that_fails_its_manifest_is_refused_by_name(base, adapters, tmp_path):
    bad = copy_run(adapters["B"], tmp_path / "B")
    path = bad / "adapter_model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(
        manifest.ManifestError, match=r"parent B: merge soup refused .*adapter_model"
    ):
        M.merge(
            [("A", str(adapters["A"]), 0.5), ("B", str(bad), 0.5)], base, tmp_path / "soup", "soup"
        )
    assert not (tmp_path / "soup").exists()


def test_adapters_and_full_weights_do_not_mix(base, adapters, fulls, tmp_path):
    with pytest.raises(MergeError, match=r"LoRA adapters \['A'\] with full weights \['F1'\]"):
        M.merge(
            [("A", str(adapters["A"]), 0.5), ("F1", str(fulls["F1"]), 0.5)],
            base,
            tmp_path / "x",
            "x",
        )
    assert not (tmp_path / "x").exists()


def rewrite(d, edit):
    """Replace d's adapter tensors by edit(tensors) and re-seal its manifest: a well-formed run
    whose content is wrong, so only the merge's own checks can catch it."""
    path = d / "adapter_model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})
    manifest.write(d)


def test_a_module_whose_base_shape_differs_is_refused(base, adapters, tmp_path):
    bad = copy_run(adapters["A"], tmp_path / "A")
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"
    rewrite(bad, lambda t: t.update({key: t[key][:, :64].contiguous()}))
    with pytest.raises(
        MergeError, match=r"parent A: module model.layers.1.self_attn.v_proj .*\[128, 64\]"
    ):
        M.merge([("A", str(bad), 1.0)], base, tmp_path / "x", "x")
    assert not (tmp_path / "x").exists()


def test_mismatched_shapes_between_parents_are_refused(base, adapters, fulls, tmp_path):
    bad = copy_run(adapters["H2"], tmp_path / "H2")
    key = "base_model.model.lm_head.weight"
    rewrite(bad, lambda t: t.update({key: t[key][:100].contiguous()}))
    with pytest.raises(
        MergeError,
        match=r"parent H2: tensor base_model.model.lm_head.weight has shape \[100, 128\]",
    ):
        M.merge(
            [("H1", str(adapters["H1"]), 0.5), ("H2", str(bad), 0.5)], base, tmp_path / "x", "x"
        )
    f2 = copy_run(fulls["F2"], tmp_path / "F2")
    t = load_file(str(f2 / "model.safetensors"))
    t["model.norm.weight"] = t["model.norm.weight"][:64].contiguous()
    save_file(t, str(f2 / "model.safetensors"), metadata={"format": "pt"})
    manifest.write(f2)
    with pytest.raises(MergeError, match=r"parent F2: tensor model.norm.weight has shape \[64\]"):
        M.merge([("F1", str(fulls["F1"]), 0.5), ("F2", str(f2), 0.5)], base, tmp_path / "x", "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "parents, message",
    [
        ([("A", "missing/dir", 1.0)], r"parent A: missing/dir is not a directory"),
        ([("A", "{A}", 0.0), ("B", "{B}", 0)], r"no parent has a non-zero weight"),
        ([("A", "{A}", float("nan"))], r"parent A: weight nan is not a finite number"),
        ([("A", "{A}", 0.5), ("A", "{B}", 0.5)], r"parent A is given twice"),
    ],
)
def test_bad_parent_lists_are_refused(base, adapters, tmp_path, parents, message):
    parents = [(a, d.format(A=adapters["A"], B=adapters["B"]), w) for a, d, w in parents]
    with pytest.raises(MergeError, match=message):
        M.merge(parents, base, tmp_path / "x", "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "lora, message",
    [
        (
            {"use_dora": True},
            r"parent D: use_dora=True in adapter_config.json: this merge knows plain LoRA only",
        ),
        ({"bias": "lora_only"}, r"parent D: bias='lora_only'"),
    ],
)
def test_adapters_that_are_not_plain_lora_are_refused(base, tmp_path, lora, message):
    d = make_adapter(base, tmp_path / "D", 0, **lora)
    with pytest.raises(MergeError, match=message):
        M.merge([("D", str(d), 1.0)], base, tmp_path / "x", "x")


def test_pattern_and_target_matching_agree_with_peft():
    """arenaflow.merge.lora matches rank/alpha patterns and target_modules itself (importing PEFT
    costs a job ~2.5 s); these are PEFT's own answers on the cases that matter."""
    from types import SimpleNamespace

    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    modules = [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.self_attn.o_proj",
        "model.layers.10.mlp.up_proj",
        "model.embed_tokens",
        "lm_head",
        "model.layers.1.self_attn.q_proj",
    ]
    patterns = {"o_proj": 2, r"layers\.1\..*q_proj": 3, "mlp.up_proj": 5, "q_proj": 7}
    for m in modules:
        assert pattern_key(patterns, m) == get_pattern_key(list(patterns), m)
    for targets, saved in (
        (["q_proj", "up_proj"], None),
        (["q_proj", "lm_head"], ["lm_head"]),
        (["self_attn.q_proj", "embed_tokens"], ["o_proj"]),
    ):
        cfg = SimpleNamespace(
            target_modules=targets,
            exclude_modules=None,
            modules_to_save=saved,
            target_parameters=None,
            layers_to_transform=None,
            layers_pattern=None,
        )
        for m in modules:
            assert peft_targets(targets, saved, m) == bool(check_target_module_exists(cfg, m)), (
                targets,
                m,
            )


def test_rank_is_refused_for_full_weights(base, fulls, tmp_path):
    with pytest.raises(MergeError, match=r"rank 4: an SVD rank applies to LoRA parents"):
        M.merge([("F1", str(fulls["F1"]), 1.0)], base, tmp_path / "x", "x", rank=4)


# ---------------------------------------------------------------- command line


def test_cli_merges_and_names_a_bad_argument(base, adapters, tmp_path, capsys):
    out = tmp_path / "soup"
    M.main(
        [
            "--arm",
            "soup",
            "--parent",
            f"A={adapters['A']}:0.5",
            "--parent",
            f"B={adapters['B']}:.5",
            "--base-model",
            base,
            "--out",
            str(out),
        ]
    )
    assert json.loads(capsys.readouterr().out)["representation"] == "concatenated rank 12"
    manifest.require(out, "test")
    with pytest.raises(SystemExit):
        M.main(
            [
                "--arm",
                "x",
                "--parent",
                f"A={adapters['A']}",
                "--base-model",
                base,
                "--out",
                str(tmp_path / "x"),
            ]
        )
    err = capsys.readouterr().err
    assert "argument --parent" in err and "expected ARM=DIR:WEIGHT" in err
    with pytest.raises(SystemExit, match=r"merge x: parent A: missing is not a directory"):
        M.main(
            [
                "--arm",
                "x",
                "--parent",
                "A=missing:1",
                "--base-model",
                base,
                "--out",
                str(tmp_path / "x"),
            ]
        )


def test_parent_and_bytes_syntax():
    assert M.parent_arg("B3=runs/B3/final:0.5") == ("B3", "runs/B3/final", 0.5)
    assert M.parent_arg("x=/a:b/c:-1e-1") == ("x", "/a:b/c", -0.1)
    for bad in ("B3:0.5", "B3=runs/B3/final", "B3=runs:abc", "=d:1"):
        with pytest.raises(Exception, match="ARM=DIR:WEIGHT|not a number"):
            M.parent_arg(bad)
    assert (
        M.bytes_arg("2G") == 2**31
        and M.bytes_arg("1000") == 1000
        and M.bytes_arg("1.5M") == 3 << 19
    )
