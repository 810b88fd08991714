"""Serving bundles, assembled and checked; a bundle that fails a check is never written.

    python -m arenaflow.bundles.build build --bundle B3f \
        (--arm B3 | --nomination nominations/r3.json) --lineage-json '{"B3": [...]}' \
        --runs runs --corpora corpora \
        --compare compare/math/greedy/B3__R2d.json --base-model DIR --bundle-json '{...}' \
        [--chat-template chatml|FILE] --out bundles/B3f
    python -m arenaflow.bundles.build diff bundles/B3 bundles/B3f

Checks, run on the assembled directory before it is moved into place:
1. template_compiles: chat_template.jinja compiles in the sandboxed Jinja environment
   transformers uses (so `{% raise_exception(...) %}` fails here, as it would in a server);
2. template_matches_renderer: it renders byte-identically to arenaflow.chat.render over eight
   conversation shapes (SHAPES: content with leading/trailing spaces and newlines, which a
   `| trim` would eat, and a conversation ending on an assistant turn, as training rows do,
   among them), with and without add_generation_prompt, and degrades without raising on an
   unknown role or None content; a template that raises while rendering fails the check with
   its message;
3. reload: AutoTokenizer.from_pretrained(bundle), base + PeftModel.from_pretrained(bundle) (or
   the bundle itself, for a full fine-tune),
   greedy generation with the bundle's stop ids on the reload prompts: each stops, none is empty,
   none contains U+FFFD (RELOAD_CHECK_PASS / RELOAD_CHECK_FAIL, outputs in reload_check.json);
4. evidence: the evidence's dataset sha256 is the corpus manifest's digest (a merge's: each
   parent's weight files are the ones it merged, by sha256), and the adapter is the arm's final
   adapter byte for byte.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import jinja2

from arenaflow import chat, io, manifest, models
from arenaflow.decode import sampling
from arenaflow.rounds import nominate, sweep

TRAINING, MERGE = "training_evidence.json", "merge_evidence.json"  # a trained arm's, a merge's
NOMINEE = (
    "nominee.json"  # a round's nominee's run: which arm it copied (arenaflow.rounds.continual)
)


def evidence_file(run_dir: Path) -> str:
    """The evidence a run carries: a trained arm's training evidence or a merge's."""
    return MERGE if (run_dir / MERGE).exists() else TRAINING


def weight_files(run_dir: Path) -> list[str]:
    """The files that carry an arm's weights: its adapter, or a full fine-tune's model files."""
    if models.is_adapter(run_dir):
        return list(models.ADAPTER_FILES)
    names = sorted(p.name for p in run_dir.glob("*.safetensors")) + ["config.json"]
    # not generation_config.json: the bundle writes its own from `serving:` (a full fine-tune's
    # run saves the base's, which the weights check then found "different")
    return names + [n for n in ("model.safetensors.index.json",) if (run_dir / n).exists()]


SHAPES = {
    "system+user": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "multi-turn": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "user-only": [{"role": "user", "content": "What is 7 * 6?"}],
    "embedded newlines": [{"role": "user", "content": "line one\nline two\n\nline four"}],
    "non-ASCII": [{"role": "user", "content": "Größe, naïve, 数学, emoji 🙂"}],
    "tool role": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "calling tool"},
        {"role": "tool", "content": '{"temp": 21}'},
    ],
    "surrounding whitespace": [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "\n\n  Hi  \n"},
        {"role": "assistant", "content": " Hello.\n\n"},
        {"role": "user", "content": "\tAgain? "},
    ],
    "ends on assistant": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4."},
    ],
}
DEGENERATE = {
    "unknown role": [{"role": "narrator", "content": "Once upon a time"}],
    "None content": [{"role": "user", "content": None}],
}


class BundleCheckError(RuntimeError):
    pass


def check_template_compiles(template: str) -> dict:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(template)
    except jinja2.TemplateSyntaxError as e:
        raise BundleCheckError(
            f"chat_template.jinja line {e.lineno}: jinja2.exceptions."
            f"TemplateSyntaxError: {e.message}"
        ) from None
    return {"verdict": "PASS", "detail": "compiles in transformers' sandboxed Jinja environment"}


def _apply(tokenizer, msgs: list[dict], gen: bool, name: str) -> str:
    try:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    except Exception as e:  # a server would fail the request: any exception fails the check
        raise BundleCheckError(
            f"template raises on {name} (add_generation_prompt={gen}): {type(e).__name__}: {e}"
        ) from None


def check_template_matches(tokenizer) -> dict:
    """Render via the reloaded tokenizer, exactly as a server would, and compare bytes."""
    checked = 0
    for name, msgs in SHAPES.items():
        for gen in (False, True):
            got = _apply(tokenizer, msgs, gen, repr(name))
            want = chat.render(msgs, add_generation_prompt=gen)
            if got != want:
                raise BundleCheckError(
                    f"template renders {name!r} (add_generation_prompt={gen}) "
                    f"differently from arenaflow.chat.render: {got!r} != {want!r}"
                )
            checked += 1
    for name, msgs in DEGENERATE.items():
        _apply(tokenizer, msgs, True, name)  # any exception is a failure of graceful degradation
    return {
        "verdict": "PASS",
        "detail": f"{checked} renders byte-identical; unknown role and None content degrade",
    }


def check_reload(
    bundle_dir: Path, base_model: str, serving: dict, system_prompt: str, prompts: list[str]
) -> dict:
    from peft import PeftModel

    tok = models.load_tokenizer(bundle_dir)
    if models.is_adapter(bundle_dir):
        model = PeftModel.from_pretrained(models.load_base(base_model), str(bundle_dir)).eval()
    else:  # full weights: the bundle is the model
        model = models.load_base(bundle_dir).eval()
    gen_cfg = io.read_json(bundle_dir / "generation_config.json")
    rendered = [
        tok.apply_chat_template(
            chat.prompt_messages(system_prompt, p), tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=serving["max_new_tokens"])
    outs = sampling.generate(model, tok, rendered, dec, desc="reload check")
    results, ok = [], True
    for p, (o,) in zip(prompts, outs):
        problems = [
            msg
            for bad, msg in (
                (not o["stopped"], "no stop token"),
                (not o["text"].strip(), "empty"),
                ("\ufffd" in o["text"], "contains U+FFFD"),
            )
            if bad
        ]
        ok &= not problems
        results.append(
            {
                "prompt": p,
                "output": o["text"],
                "n_tokens": o["n_tokens"],
                "stopped": o["stopped"],
                "problems": problems,
            }
        )
    verdict = "RELOAD_CHECK_PASS" if ok else "RELOAD_CHECK_FAIL"
    record = {"verdict": verdict, "eos_token_id": gen_cfg["eos_token_id"], "outputs": results}
    io.write_json(bundle_dir / "reload_check.json", record)
    if not ok:
        raise BundleCheckError(
            f"{verdict}: "
            + "; ".join(f"{r['prompt']!r}: {r['problems']}" for r in results if r["problems"])
        )
    return {"verdict": verdict, "detail": f"{len(results)} prompts stopped, non-empty, no U+FFFD"}


def check_evidence(bundle_dir: Path, run_dir: Path, corpus_dir: Path | None) -> dict:
    """A trained arm's evidence names its corpus's digest; a merge's names each parent's weight
    files by sha256, which must be the parent run's (verified by its manifest before the build)."""
    if (bundle_dir / MERGE).exists():
        detail = _check_merge_parents(io.read_json(bundle_dir / MERGE), run_dir.parent.parent)
    else:
        evidence = io.read_json(bundle_dir / TRAINING)
        if "mixture" in evidence:
            digest = _check_mixture(evidence, corpus_dir)
            detail = f"dataset sha256 = the mixture's of {len(evidence['mixture'])} corpora"
        else:
            digest = manifest.verify(corpus_dir)["digest"]
            detail = f"dataset sha256 = corpus digest {digest[:16]}…"
        if evidence["dataset_sha256"] != digest:
            raise BundleCheckError(
                f"{TRAINING} dataset_sha256 {evidence['dataset_sha256']} "
                f"is not {corpus_dir}'s digest {digest}"
            )
    for f in weight_files(run_dir):
        if manifest.sha256_file(bundle_dir / f) != manifest.sha256_file(run_dir / f):
            raise BundleCheckError(f"{f} differs from {run_dir / f}")
    return {"verdict": "PASS", "detail": f"{detail}; adapter = {run_dir.name} of the arm"}


def _check_mixture(evidence: dict, corpora: Path) -> str:
    """A mixture's digest recomputed from its sources as they verify now (arenaflow.train.data):
    each source corpus must still be the one trained on."""
    from arenaflow.train.data import mixture_digest

    for src in evidence["mixture"]:
        digest = manifest.verify(corpora / src["corpus"])["digest"]
        if digest != src["digest"]:
            raise BundleCheckError(
                f"{TRAINING}: mixture source {src['corpus']} was digest {src['digest'][:16]}…, "
                f"{corpora / src['corpus']} is {digest[:16]}…"
            )
    sources = evidence["mixture"]
    return mixture_digest(evidence["mixture_seed"], sources, [s["asked"] for s in sources])


def evidence_corpora(evidence: dict) -> list[str]:
    """The corpora a trained arm's evidence names: its corpus, or each source of its mixture."""
    if "mixture" in evidence:
        return [s["corpus"] for s in evidence["mixture"]]
    return [evidence["corpus"]]


def _check_merge_parents(evidence: dict, runs: Path) -> str:
    for p in evidence["parents"]:
        files = manifest.verify(runs / p["arm"] / "final")["files"]
        for name, sha in p["files_sha256"].items():
            if files.get(name, {}).get("sha256") != sha:
                raise BundleCheckError(
                    f"{MERGE}: parent {p['arm']}'s {name} is not the one merged "
                    f"(recorded {sha[:16]}…)"
                )
    return (
        "merged from "
        + " + ".join(f"{p['weight']:g} x {p['arm']}" for p in evidence["parents"])
        + " (each parent's weights by sha256)"
    )


def generation_config(tokenizer, serving: dict) -> dict:
    return {
        "do_sample": serving["do_sample"],
        "temperature": serving["temperature"],
        "top_p": serving["top_p"],
        "top_k": 0,
        "repetition_penalty": serving["repetition_penalty"],
        "max_new_tokens": serving["max_new_tokens"],
        "eos_token_id": sampling.stop_token_ids(tokenizer),
        "pad_token_id": models.pad_id(tokenizer),  # EOS for a base without a pad token
    }


def save_tokenizer(base_model: str, template: str, out: Path):
    """The base's tokenizer with `template` as its chat template, which servers read from either
    file, so both carry it. Nothing else changes (no pad token is added): it reloads as the
    base's."""
    tok = models.load_tokenizer(base_model)
    tok.chat_template = template
    tok.save_pretrained(str(out))
    io.write_text(out / "chat_template.jinja", template)
    tok_cfg = io.read_json(out / "tokenizer_config.json")
    io.write_json(out / "tokenizer_config.json", {**tok_cfg, "chat_template": template})
    return tok


def load_template(spec: str) -> str:
    """'chatml' (the training renderer's own template) or a template file's path."""
    if spec == "chatml":
        return chat.CHATML_TEMPLATE
    return Path(spec).read_text(encoding="utf-8")


def card_context(args, arm: str, lineage: list[str], nomination: dict | None) -> dict:
    runs, corpora = Path(args.runs), Path(args.corpora)
    training, corpus_ids = [], []
    for a in reversed([arm, *lineage]):
        run = runs / a / "final"
        if evidence_file(run) == MERGE:
            training.append(_merge_row(a, io.read_json(run / MERGE)))
            continue
        ev = io.read_json(run / TRAINING)
        if "mixture" in ev:  # the rows trained on, from each source
            rows = sum(s["rows"] for s in ev["mixture"])
        else:
            rows = io.read_json(corpora / ev["corpus"] / "stats.json")["rows"]
        training.append(
            {
                "arm": a,
                "method": ev["hyperparameters"]["method"],
                "init": ev["init"],
                "corpus": ev["corpus"],
                "rows": rows,
                "steps": ev["optimizer_steps"],
                "lr": ev["hyperparameters"]["lr"],
                "job": ev["job_id"],
            }
        )
        corpus_ids += evidence_corpora(ev)
    corpora_ctx = []
    for c in dict.fromkeys(corpus_ids):
        st = io.read_json(corpora / c / "stats.json")
        corpora_ctx.append(
            {
                "id": c,
                "digest": io.read_json(corpora / c / "manifest.json")["digest"],
                "pass_at_1": st.get("pass_at_1"),
                **{
                    k: st.get(k)
                    for k in (
                        "rows",
                        "tokens",
                        "supervised_tokens",
                        "solved",
                        "prompts",
                        "unsolved_dropped",
                    )
                },
            }
        )
    evaluations = []
    for path in (
        args.compare
    ):  # written by `arenaflow.evals.readout compare`, which records its suite and regime
        c = io.read_json(path)
        evaluations.append({**c, "suite": f"{c['suite']}/{c['regime']}"})
    return {
        "training": training,
        "corpora": corpora_ctx,
        "evaluations": evaluations,
        "nomination": nomination,
        "sweep": card_sweep(nomination, json.loads(args.arms_json or "{}")),
        "lineage": list(reversed([arm, *lineage])),
    }


def card_sweep(nomination: dict | None, arms: dict) -> dict | None:
    """The nominating round's LR sweep, read as the round report reads it, for the card's 'why this
    learning rate' section (lineage 000's card gives its sweep so): its candidates in LR order
    with their sealed deltas, W/L and p, and the reading. `arms`: {arm: {init, policy, lr}} as
    configured. None without a nomination or a sweep of three learning rates."""
    if not nomination:
        return None
    cands = {c["arm"]: c for c in nomination["candidates"]}
    rnd = {"candidates": list(cands), "regime": nomination["regime"]}
    r = sweep.sweep_reading(rnd, arms, {(rnd["regime"], a): c for a, c in cands.items()})
    if r is None:
        return None
    return {
        "rows": [{**cands[a], "lr": sweep.lr_text(lr)} for a, lr in zip(r["order"], r["lr"])],
        "init": arms[r["best"]].get("init"),
        "policy": arms[r["best"]].get("policy"),
        "reading": sweep.sweep_sentence(r),
    }


def _merge_row(arm: str, ev: dict) -> dict:
    """A merge in the card's training table: its weights in place of an init, no corpus."""
    made = " + ".join(f"{p['weight']:g} x {p['arm']}" for p in ev["parents"])
    return {
        "arm": arm,
        "method": f"merge ({ev['representation']})",
        "init": made,
        "corpus": "none",
        "rows": 0,
        "steps": 0,
        "lr": "-",
        "job": "CPU",
        "merge": ev,
    }


def disk_lineage(runs: Path, arm: str) -> list[str]:
    """`arm` and its ancestors, nearest first, as their runs record them: a trained arm's init,
    a merge's parents. A round's nominee (runs/{round}-nominee, arenaflow.rounds.continual) stands
    for
    the arm it copied, so the card names the arm whose weights these are, not every arm the
    round could have promoted (the config's lineage of an arm after a nominee)."""
    out, todo = [], [arm]
    while todo:
        a = real_arm(runs, todo.pop(0))
        if a == "base" or a in out:
            continue
        out.append(a)
        run = runs / a / "final"
        ev = io.read_json(run / evidence_file(run))
        todo += [p["arm"] for p in ev["parents"]] if "parents" in ev else [ev["init"]]
    return out


def real_arm(runs: Path, arm: str) -> str:
    """The arm a round's nominee copied (itself for any other arm)."""
    alias = runs / arm / "final" / NOMINEE
    return io.read_json(alias)["arm"] if alias.exists() else arm


def served_evidence(run_dir: Path, runs: Path) -> dict:
    """What the card and serving_config.json say of the served weights. A merge's base and
    method are its parents': read from the first trained arm among them, and the LoRA geometry
    from its own adapter_config.json."""
    if evidence_file(run_dir) == TRAINING:
        return io.read_json(run_dir / TRAINING)
    ev, parent = io.read_json(run_dir / MERGE), run_dir
    while evidence_file(parent) == MERGE:
        parent = runs / io.read_json(parent / MERGE)["parents"][0]["arm"] / "final"
    trained = io.read_json(parent / TRAINING)
    hyper = {"method": "lora" if ev["output"] == "adapter" else "full", "objective": "merge"}
    if ev["output"] == "adapter":
        cfg = io.read_json(run_dir / models.ADAPTER_CONFIG)
        hyper["lora"] = {
            "r": cfg["r"],
            "alpha": cfg["lora_alpha"],
            "dropout": cfg["lora_dropout"],
            "target_modules": sorted(cfg["target_modules"]),
            "modules_to_save": cfg.get("modules_to_save") or [],
        }
    return {
        **ev,
        "base_model": trained["base_model"],
        "base_revision": trained["base_revision"],
        "hyperparameters": hyper,
    }


def verify_sources(args, arm: str, lineage: list[str]) -> None:
    """Everything a bundle copies or cites, verified before any of it is read: every run of the
    lineage (the served one's adapter and evidence are copied, the others' evidence is cited in
    the card), their corpora, and the sealed compare JSONs the card reports."""
    who, corpora = f"bundle {args.bundle}", set()
    for a in [arm, *lineage]:
        run = Path(args.runs) / a / "final"
        manifest.require(run, who)
        # a round's nominee (an arm's init or a corpus's policy) is a copy of an arm that the
        # lineage holds too: verified there, with its corpora
        if evidence_file(run) == TRAINING and not (run / NOMINEE).exists():
            corpora.update(evidence_corpora(io.read_json(run / TRAINING)))
    for c in sorted(corpora):
        manifest.require(Path(args.corpora) / c, who)
    for path in args.compare:
        manifest.check_seal(io.read_json(path), path)


def sealed_nomination(path: str) -> dict:
    """The nomination, refused unless its seal holds and every file it judged (paths relative to
    the results directory, the cwd) is unchanged: a hand-edited `promoted` would otherwise serve
    one arm under another's numbers."""
    try:
        return nominate.load_sealed(path, root=".")
    except nominate.SealError as e:
        raise BundleCheckError(str(e)) from None


def build(args) -> None:
    """Assemble the bundle in a temporary directory, check it, then move it into place: the
    served arm and its sources verified, the serving files, the checks, the model card."""
    cfg = json.loads(args.bundle_json)
    searched = chosen_prompt(args, cfg)
    nomination = sealed_nomination(args.nomination) if args.nomination else None
    arm = served_arm(args, nomination)
    run_dir = Path(args.runs) / arm / "final"
    evidence = served_evidence(run_dir, Path(args.runs))
    corpus_dir = (
        None
        if "corpus" not in evidence
        else Path(args.corpora)  # a mixture: its sources, under corpora/
        if "mixture" in evidence
        else Path(args.corpora) / evidence["corpus"]
    )
    template = load_template(args.chat_template or cfg["chat_template"])
    with io.atomic_dir(Path(args.out)) as tmp:
        tok = write_serving_files(tmp, args.base_model, run_dir, evidence, arm, cfg, template)
        checks = run_checks(tmp, args, cfg, template, run_dir, corpus_dir)
        if searched:
            checks["system_prompt"] = searched
        if nomination:
            checks["nomination"] = {
                "verdict": "PASS",
                "detail": (
                    f"{args.nomination} sealed (digest {nomination['digest'][:16]}…), "
                    f"its {len(nomination['inputs'])} judged files unchanged"
                ),
            }
        lineage = disk_lineage(Path(args.runs), arm)[1:]
        ctx = card_context(args, arm, lineage, nomination)
        write_card(tmp, args.bundle, arm, evidence, cfg["serving"], tok, checks, ctx)
        io.write_json(tmp / "checks.json", checks)
        verdicts = {k: v["verdict"] for k, v in checks.items()}
        manifest.write(tmp, params=cfg, extra={"arm": arm, "checks": verdicts})
    print(
        f"bundle {args.bundle}: arm {arm}, checks "
        + ", ".join(f"{k}={v}" for k, v in verdicts.items())
    )


def chosen_prompt(args, cfg: dict) -> dict | None:
    """For `system_prompt: {search: S}`, put the prompt search's chosen text in cfg (what
    system_prompt.txt and the reload check use) and return the check that records it; the
    search's file must be the sealed record of that search."""
    spec = cfg.get("system_prompt")  # the resolved bundle always has one; by hand, maybe not
    if not isinstance(spec, dict):
        return None
    if not args.prompt_search:
        raise BundleCheckError(f"system_prompt {spec} needs --prompt-search FILE")
    rec = manifest.check_seal(io.read_json(args.prompt_search), args.prompt_search)
    if rec.get("search") != spec["search"]:
        raise BundleCheckError(
            f"{args.prompt_search} is prompt search {rec.get('search')!r}, not {spec['search']!r}"
        )
    cfg["system_prompt"] = rec["chosen_text"]
    return {
        "verdict": "PASS",
        "detail": (
            f"system prompt {rec['chosen']!r} chosen by prompt search {rec['search']!r} on arm "
            f"{rec['arm']!r} ({args.prompt_search}, {manifest.SEAL} {rec[manifest.SEAL][:16]}…)"
        ),
    }


def served_arm(args, nomination: dict | None) -> str:
    """The arm to serve, its lineage's sources verified; a round that kept a nominee serves the
    arm that nominee copied."""
    arm = nomination["promoted"] if nomination else args.arm
    if arm == "base":
        raise SystemExit(
            f"bundle {args.bundle}: round promoted 'base', which has no adapter to serve"
        )
    verify_sources(args, arm, json.loads(args.lineage_json)[arm])
    return real_arm(Path(args.runs), arm)


def write_serving_files(
    tmp: Path, base_model: str, run_dir: Path, evidence: dict, arm: str, cfg: dict, template: str
):
    """The weights and evidence, the tokenizer with the template, the system prompt and the
    decoding a server reads; returns the tokenizer."""
    for f in [*weight_files(run_dir), evidence_file(run_dir)]:
        shutil.copyfile(run_dir / f, tmp / f)
    tok = save_tokenizer(base_model, template, tmp)
    io.write_text(tmp / "system_prompt.txt", cfg["system_prompt"] + "\n")
    io.write_json(tmp / "generation_config.json", generation_config(tok, cfg["serving"]))
    io.write_json(
        tmp / "serving_config.json",
        {
            "base_model": evidence["base_model"],
            "base_revision": evidence["base_revision"],
            "arm": arm,
            "system_prompt_file": "system_prompt.txt",
            "chat_template_file": "chat_template.jinja",
            "add_generation_prompt": True,
            **cfg["serving"],
        },
    )
    return tok


def run_checks(
    tmp: Path, args, cfg: dict, template: str, run_dir: Path, corpus_dir: Path | None
) -> dict:
    """Checks 1-4 of the module docstring, on the assembled directory; the first that fails
    raises BundleCheckError."""
    checks = {"template_compiles": check_template_compiles(template)}
    reloaded = models.load_tokenizer(tmp)
    if reloaded.chat_template != template:
        raise BundleCheckError(
            "the reloaded tokenizer does not carry chat_template.jinja's template"
        )
    checks["template_matches_renderer"] = check_template_matches(reloaded)
    checks["reload"] = check_reload(
        tmp, args.base_model, cfg["serving"], cfg["system_prompt"], cfg["reload_prompts"]
    )
    checks["evidence"] = check_evidence(tmp, run_dir, corpus_dir)
    return checks


def write_card(
    tmp: Path, bundle: str, arm: str, evidence: dict, serving: dict, tok, checks: dict, ctx: dict
) -> None:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("arenaflow", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    card = env.get_template("model_card.md.j2").render(
        bundle=bundle,
        arm=arm,
        evidence=evidence,
        code=manifest.code_version(),
        serving=serving,
        eos_ids=sampling.stop_token_ids(tok),
        checks=checks,
        **ctx,
    )
    io.write_text(tmp / "README.md", card)


def diff(a: Path, b: Path) -> tuple[list[str], bool]:
    """(files that differ or exist on one side only, weights byte-identical?)"""
    fa = manifest.list_files(a)
    fb = manifest.list_files(b)
    differ = sorted(
        f for f in set(fa) | set(fb) if fa.get(f, {}).get("sha256") != fb.get(f, {}).get("sha256")
    )
    weights = [f for f in set(fa) | set(fb) if f.endswith(".safetensors")]
    same = bool(weights) and not set(weights) & set(differ)
    return differ, same


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="assemble and check one bundle")
    b.add_argument("--bundle", required=True)
    b.add_argument("--arm", help="the arm to serve (or give --nomination)")
    b.add_argument("--nomination", help="nominations/{round}.json: serve the arm it promotes")
    b.add_argument("--lineage-json", required=True, help="{arm: [ancestor arms, nearest first]}")
    b.add_argument("--runs", required=True, help="the runs/ directory")
    b.add_argument("--corpora", required=True, help="the corpora/ directory")
    b.add_argument("--compare", nargs="*", default=[], help="compare JSONs to report in the card")
    b.add_argument(
        "--arms-json", help="{arm: {init, policy, lr}}, as configured: the card reads the LR sweep"
    )
    b.add_argument("--base-model", required=True)
    b.add_argument("--bundle-json", required=True, help="the bundle's config section as JSON")
    b.add_argument(
        "--chat-template", help="'chatml' or a template file (default: the bundle config's)"
    )
    b.add_argument(
        "--prompt-search", help="prompt_search/{search}.json, for system_prompt: {search: S}"
    )
    b.add_argument("--out", required=True, help="bundles/{bundle}")
    d = sub.add_parser("diff", help="which files differ and whether the weights are identical")
    d.add_argument("a")
    d.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "diff":
        differ, same = diff(Path(args.a), Path(args.b))
        for f in differ:
            print(f"Files {Path(args.a) / f} and {Path(args.b) / f} differ")
        print(f"{len(differ)} files differ; weights {'byte-identical' if same else 'DIFFER'}")
        return
    if bool(args.arm) == bool(args.nomination):
        ap.error("give exactly one of --arm and --nomination")
    try:
        build(args)
    except (BundleCheckError, manifest.ManifestError) as e:
        print(f"bundle {args.bundle}: check failed, no bundle written: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
