"""Serving bundles, assembled and checked; a bundle that fails a check is never written.

    python -m arenaflow.bundles.build build --bundle B3f \
        (--arm B3 | --nomination nominations/r3.json) --lineage-json '{"B3": [...]}' \
        --runs runs --corpora corpora \
        --compare compare/math/greedy/B3__R2d.json --base-model DIR --bundle-json '{...}' \
        [--base-chat-template own|chatml|FILE] [--chat-template base|chatml|FILE] --out bundles/B3f
    python -m arenaflow.bundles.build diff bundles/B3 bundles/B3f

Checks, run on the assembled directory before it is moved into place:
1. template_compiles: chat_template.jinja compiles in the sandboxed Jinja environment
   transformers uses (so `{% raise_exception(...) %}` fails here, as it would in a server);
2. template_matches_renderer: it renders byte-identically to arenaflow.chat.render, in the chat
   format the lineage was trained in (base.chat_template, --base-chat-template), over the
   14 named conversation shapes (SHAPES: content with leading/trailing spaces and newlines, which a
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
   adapter byte for byte;
5. serving engines (arenaflow.bundles.serving): whether vLLM, SGLang and TGI serve the adapter
   as it is, or need merged weights and why; merged/ when one needs it (or `merged: always`),
   equal to base + adapter (merged_check.json); each engine's command in serving_config.json;
   vLLM's offline answers against the reload check's, where vLLM and a GPU are present.

This module assembles the bundle and holds the command line; the checks are in
arenaflow.bundles.checks, the model card in arenaflow.bundles.card, and the reading and
verification of the runs a bundle serves and cites in arenaflow.bundles.sources.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from arenaflow import chat, io, manifest, models, paths
from arenaflow.bundles.card import card_context, write_card
from arenaflow.bundles.checks import BundleCheckError, run_checks
from arenaflow.bundles.serving import add_serving
from arenaflow.bundles.sources import (
    check_judged_weights,
    disk_lineage,
    evidence_file,
    real_arm,
    served_evidence,
    verify_sources,
    weight_files,
)
from arenaflow.decode import sampling
from arenaflow.rounds import nominate


def generation_config(tokenizer, serving: dict, base_model: str | None = None) -> dict:
    return {
        "do_sample": serving["do_sample"],
        "temperature": serving["temperature"],
        "top_p": serving["top_p"],
        "top_k": 0,
        "repetition_penalty": serving["repetition_penalty"],
        "max_new_tokens": serving["max_new_tokens"],
        "eos_token_id": sampling.stop_token_ids(tokenizer, base_generation_config(base_model)),
        "pad_token_id": models.pad_id(tokenizer),  # EOS for a base without a pad token
    }


def base_generation_config(base_model: str | None):
    """The base's generation_config (its EOS ids are stop ids too), None if it ships none."""
    from transformers import GenerationConfig

    if base_model is None or not (Path(base_model) / "generation_config.json").is_file():
        return None
    return GenerationConfig.from_pretrained(base_model)


def save_tokenizer(base_model: str, template: str, out: Path, base_template: str | None = None):
    """The base's tokenizer as training used it (`base_template`, base.chat_template: with the
    ChatML tokens it installed, if any) with `template` as its chat template, which servers read
    from either file, so both carry it. Nothing else changes (no pad token is added): it reloads
    as the base's."""
    tok = models.load_tokenizer(base_model, base_template)
    tok.chat_template = template
    tok.save_pretrained(str(out))
    io.write_text(out / "chat_template.jinja", template)
    tok_cfg = io.read_json(out / "tokenizer_config.json")
    io.write_json(out / "tokenizer_config.json", {**tok_cfg, "chat_template": template})
    return tok


def load_template(spec: str, trained: str | None = None) -> str:
    """'chatml' (the ChatML renderer's template), 'base' (`trained`: the template the lineage
    was trained in, base.chat_template's) or a template file's path."""
    if spec == "chatml":
        return chat.CHATML_TEMPLATE
    if spec == "base":
        return trained or chat.CHATML_TEMPLATE
    return Path(spec).read_text(encoding="utf-8")


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
    run_dir = paths.run_under(args.runs, arm)
    evidence = served_evidence(run_dir, Path(args.runs))
    corpus_dir = (
        None
        if "corpus" not in evidence
        else Path(args.corpora)  # a mixture: its sources, under corpora/
        if "mixture" in evidence
        else Path(args.corpora) / evidence["corpus"]
    )
    trained = models.load_tokenizer(args.base_model, args.base_chat_template)
    template = load_template(args.chat_template or cfg["chat_template"], trained.chat_template)
    with io.atomic_dir(Path(args.out)) as tmp:
        tok = write_serving_files(tmp, args, run_dir, evidence, arm, cfg, template)
        checks = run_checks(tmp, args, cfg, template, run_dir, corpus_dir, chat.format_of(trained))
        checks.update(add_serving(tmp, args.bundle, args.base_model, evidence, cfg))
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
        ctx["engines"] = io.read_json(tmp / "serving_config.json")["serving_engines"]
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
    if nomination:
        check_judged_weights(nomination, arm, Path(args.runs), f"bundle {args.bundle}")
    return real_arm(Path(args.runs), arm)


def write_serving_files(
    tmp: Path, args, run_dir: Path, evidence: dict, arm: str, cfg: dict, template: str
):
    """The weights and evidence, the tokenizer with the template, the system prompt and the
    decoding a server reads; returns the tokenizer."""
    for f in [*weight_files(run_dir), evidence_file(run_dir)]:
        shutil.copyfile(run_dir / f, tmp / f)
    tok = save_tokenizer(args.base_model, template, tmp, args.base_chat_template)
    io.write_text(tmp / "system_prompt.txt", cfg["system_prompt"] + "\n")
    # the stops the bundle was evaluated with: the trained template's, not the served one's,
    # which the template check has yet to pass (a broken one is refused there, by name)
    trained = models.load_tokenizer(args.base_model, args.base_chat_template)
    gen = generation_config(trained, cfg["serving"], args.base_model)
    io.write_json(tmp / "generation_config.json", gen)
    io.write_json(
        tmp / "serving_config.json",
        {
            "base_model": evidence["base_model"],
            "base_revision": evidence["base_revision"],
            "arm": arm,
            "system_prompt_file": "system_prompt.txt",
            "chat_template_file": "chat_template.jinja",
            # how it was chosen: base.chat_template (own, chatml or a file), the bundle's own
            "chat_template": {
                "base": args.base_chat_template or "as saved",
                "bundle": args.chat_template or cfg["chat_template"],
                "sha256": manifest.sha256_text(template),
            },
            "add_generation_prompt": True,
            **cfg["serving"],
        },
    )
    return tok


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
        "--chat-template",
        help="'base', 'chatml' or a template file (default: the bundle config's)",
    )
    b.add_argument(
        "--base-chat-template",
        help="base.chat_template the lineage was trained in: own, chatml or a .jinja file",
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
