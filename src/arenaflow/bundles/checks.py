"""The checks a bundle must pass before it is written (checks 1-4 of arenaflow.bundles.build).

Consumes the assembled bundle directory, its chat template, the served run and its corpus;
produces {check: {verdict, detail}} and reload_check.json, or raises BundleCheckError.

The serving renderer is the bundle's reloaded tokenizer's apply_chat_template with its
chat_template.jinja, as transformers-based servers render a request; arenaflow.chat.render is
what training rows and readouts were rendered with. The template check holds the first to the
second on named conversations of the shapes pools produce (SHAPES) and names the conversation,
the first differing character and the messages a template lost or rewrote.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from arenaflow import chat, io, manifest, models, paths
from arenaflow.bundles.sources import MERGE, TRAINING, weight_files
from arenaflow.decode import sampling

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
    # what imported chat pools (arenaflow.pools.imported) and multi-turn readouts hand the
    # renderer: long contexts, a system turn anywhere, repeated roles, Windows line ends
    "ten messages": [
        {"role": "system", "content": "You are a terse tutor."},
        *[{"role": "user" if i % 2 else "assistant", "content": f"Turn {i}."} for i in range(1, 9)],
        {"role": "user", "content": "Summarise our talk."},
    ],
    "repeated roles": [
        {"role": "user", "content": "First question."},
        {"role": "user", "content": "And a second one."},
        {"role": "assistant", "content": "Answer one."},
        {"role": "assistant", "content": "Answer two."},
        {"role": "user", "content": "Thanks."},
    ],
    "system not first": [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "system", "content": "From now on, answer in French."},
        {"role": "user", "content": "How are you?"},
    ],
    "CRLF": [
        {"role": "system", "content": "Rules:\r\n1. Be brief.\r\n2. Be kind.\r\n"},
        {"role": "user", "content": "Line one\r\nline two\r\n\r\nline four\rold Mac end"},
        {"role": "assistant", "content": "Got it.\r\n"},
        {"role": "user", "content": "\r\nAgain?\r\n"},
    ],
    # plain role/content tool turns render like any turn; structured tool calls (an assistant's
    # tool_calls, a tool turn's tool_call_id) arenaflow.chat cannot render, and pools refuse them
    "tool turns": [
        {"role": "system", "content": "You can call get_weather(city)."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": 'get_weather("Oslo")'},
        {"role": "tool", "content": '{"temp_c": -3, "sky": "snow"}'},
        {"role": "assistant", "content": "It is -3 °C and snowing in Oslo."},
        {"role": "user", "content": "And tomorrow?"},
    ],
    "twelve messages, repeated roles and a late system turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "Seven."},
        {"role": "user", "content": "Another."},
        {"role": "user", "content": "Bigger\r\nthan ten."},
        {"role": "assistant", "content": "Eleven."},
        {"role": "system", "content": "Now be verbose."},
        {"role": "user", "content": "Why is it prime?"},
        {"role": "assistant", "content": "is_prime(11)"},
        {"role": "tool", "content": "true"},
        {"role": "assistant", "content": "No divisor below its square root."},
        {"role": "user", "content": "Thanks!"},
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


def _lost(msgs: list[dict], served: str) -> list[str]:
    """The messages whose content is not found in `served`, in order after the previous one's:
    dropped, truncated away or rewritten."""
    lost, pos = [], 0
    for i, m in enumerate(msgs):
        at = served.find(m["content"], pos)
        if at < 0:
            lost.append(f"{i} ({m['role']})")
        else:
            pos = at + len(m["content"])
    return lost


def _where(msgs: list[dict], at: int, gen: bool) -> str:
    """Which part of arenaflow.chat.render(msgs) character `at` falls in."""
    end = 0
    for i, m in enumerate(msgs):
        end += len(chat.render_turn(m["role"], m["content"]))
        if at < end:
            return f"message {i} ({m['role']})"
    return "the generation prompt" if gen and at < end + len(chat.render([], True)) else "the end"


def _difference(name: str, msgs: list[dict], gen: bool, got: str, want: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    lo = max(0, at - 30)
    lost = _lost(msgs, got)
    return (
        f"template renders {name!r} (add_generation_prompt={gen}) differently from "
        f"arenaflow.chat.render: first difference at character {at}, in "
        f"{_where(msgs, at, gen)}: served {got[lo : at + 30]!r}, arenaflow {want[lo : at + 30]!r}"
        + (f"; messages lost or rewritten: {', '.join(lost)}" if lost else "")
    )


def _trained(fmt, msgs: list[dict], gen: bool) -> str | None:
    """How training rendered `msgs` (None: the base's own template refuses that shape, a system
    turn on Gemma, say, and so then must the served one)."""
    if fmt is None:
        return chat.render(msgs, add_generation_prompt=gen)
    try:
        return chat.render(msgs, gen, fmt)
    except Exception:  # the template's own raise_exception: a shape it does not take
        return None


def check_template_matches(tokenizer, fmt=None) -> dict:
    """Render via the reloaded tokenizer, exactly as a server would, and compare bytes with the
    renderer training used (`fmt`, chat.format_of; None: ChatML)."""
    checked, refused = 0, 0
    for name, msgs in SHAPES.items():
        for gen in (False, True):
            want = _trained(fmt, msgs, gen)
            if want is None:
                refused += 1
                continue
            got = _apply(tokenizer, msgs, gen, repr(name))
            if got != want:
                raise BundleCheckError(_difference(name, msgs, gen, got, want))
            checked += 1
    if fmt is None:  # a base's own template degrades (or not) as the base does
        for name, msgs in DEGENERATE.items():
            _apply(tokenizer, msgs, True, name)  # an exception fails graceful degradation
    return {
        "verdict": "PASS",
        "detail": (
            f"{checked} renders of {len(SHAPES)} conversations byte-identical; "
            + (
                "unknown role and None content degrade"
                if fmt is None
                else f"{refused} shapes the trained template refuses skipped"
            )
        ),
    }


def check_reload(
    bundle_dir: Path, base_model: str, serving: dict, system_prompt: str, prompts: list[str]
) -> dict:
    from peft import PeftModel

    tok = models.load_tokenizer(bundle_dir)
    if models.is_adapter(bundle_dir):
        base = models.fit_embeddings(models.load_base(base_model), tok)
        model = PeftModel.from_pretrained(base, str(bundle_dir)).eval()
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


def _check_merge_parents(evidence: dict, runs: Path) -> str:
    for p in evidence["parents"]:
        files = manifest.verify(paths.run_under(runs, p["arm"]))["files"]
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


def run_checks(
    tmp: Path, args, cfg: dict, template: str, run_dir: Path, corpus_dir: Path | None, fmt=None
) -> dict:
    """Checks 1-4 of arenaflow.bundles.build's docstring, on the assembled directory; the first
    that fails raises BundleCheckError."""
    checks = {"template_compiles": check_template_compiles(template)}
    reloaded = models.load_tokenizer(tmp)
    if reloaded.chat_template != template:
        raise BundleCheckError(
            "the reloaded tokenizer does not carry chat_template.jinja's template"
        )
    checks["template_matches_renderer"] = check_template_matches(reloaded, fmt)
    checks["reload"] = check_reload(
        tmp, args.base_model, cfg["serving"], cfg["system_prompt"], cfg["reload_prompts"]
    )
    checks["evidence"] = check_evidence(tmp, run_dir, corpus_dir)
    return checks
